"""dtype="bfloat16" against fp32 on the CPU, one process, the two engines interleaved in rounds
(each round embeds the whole corpus with each engine, in alternating order), so load drift on a
shared machine hits both alike:
    .venv/bin/python benchmarks/bf16_vs_fp32.py [--corpus long|mixed] [--threads 2] [--rounds 3]
Prints texts/s of each engine per round, the bf16/fp32 ratio per round and its median, the min
and mean cosine of bf16 embeddings to fp32 ones, the bf16 path the engine took, the CPU kind
and the load average. The bf16 engine runs with precision_check="off" so the ratio is measured
even where the load-time check would fall back.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="long", choices=["long", "mixed"])
    parser.add_argument("--size", type=int, default=2000, help="mixed corpus size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    import torch

    from pooler.bench import corpus
    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.model_folder import DEFAULT_MODEL

    torch.set_num_threads(args.threads)
    texts = corpus.long_mix() if args.corpus == "long" else corpus.mixed_corpus(args.size)
    model = args.model or DEFAULT_MODEL
    engines = {
        "fp32": Engine(model, device="cpu", num_threads=args.threads),
        "bf16": Engine(model, device="cpu", dtype="bfloat16", precision_check="off",
                       num_threads=args.threads),
    }
    for engine in engines.values():
        engine.embed(texts[:32], use_tqdm=False)  # warm up kernels, pack weights
    cpu = cpu_features()
    print(f"cpu: {cpu.summary()}; bf16 path: {engines['bf16'].precision_path}; "
          f"{len(texts)} texts ({args.corpus}), {args.threads} threads")
    ratios, outputs = [], {}
    for index in range(args.rounds):
        order = list(engines) if index % 2 == 0 else list(reversed(engines))
        rates = {}
        for name in order:
            start = time.perf_counter()
            out = engines[name].embed(texts, use_tqdm=False)
            rates[name] = len(texts) / (time.perf_counter() - start)
            outputs[name] = np.stack([o.embedding for o in out]).astype(np.float64)
        ratios.append(rates["bf16"] / rates["fp32"])
        print(f"round {index + 1}: fp32 {rates['fp32']:.1f} texts/s, bf16 {rates['bf16']:.1f} "
              f"texts/s, bf16/fp32 {ratios[-1]:.2f}x; load average {os.getloadavg()[0]:.1f}")
    a, b = outputs["fp32"], outputs["bf16"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    print(f"median bf16/fp32 {float(np.median(ratios)):.2f}x; cosine to fp32 min "
          f"{cos.min():.6f} mean {cos.mean():.6f}")


if __name__ == "__main__":
    main()
