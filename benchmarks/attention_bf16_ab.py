"""The bf16 attention kernel (pooler/kernels/attention_bf16.c) on and off, for the int8 and the
bf16 engines, against fp32, in one process: interleaved rounds over the long mix, each engine
run with the kernel on and off in alternating order, so load drift hits every side alike.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_bf16_ab.py [--threads 2] [--rounds 3]
        [--cpu-time]  # CPU seconds (use with --threads 1): steadier on a shared machine

Prints texts/s per side and round, each side's ratio to fp32 (median over rounds), min cosine
to fp32 per side, the CPU kind and the load average. Needs AVX512_BF16 (else it says so)."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=0, help="first N of the long mix (0: all)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time in CPU seconds of this process instead of wall seconds")
    args = parser.parse_args()

    import torch

    from pooler.bench import corpus
    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.kernels import attention_cpu
    from pooler.model_folder import DEFAULT_MODEL

    torch.set_num_threads(args.threads)
    cpu = cpu_features()
    if attention_cpu.bf16_attention_kernels() is None:
        print(f"cpu: {cpu.summary()}: the bf16 attention kernel does not run here")
        return
    texts = corpus.long_mix()
    texts = texts[:args.texts] if args.texts else texts
    common = dict(device="cpu", num_threads=args.threads, precision_check="off")
    engines = {"fp32": Engine(DEFAULT_MODEL, device="cpu", num_threads=args.threads),
               "int8": Engine(DEFAULT_MODEL, quantization="int8", **common),
               "bf16": Engine(DEFAULT_MODEL, dtype="bfloat16", **common)}
    sides = [("fp32", True), ("int8", True), ("int8", False), ("bf16", True), ("bf16", False)]
    for engine in engines.values():
        engine.embed(texts[:32], use_tqdm=False)  # warm up, pack weights
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(f"cpu: {cpu.summary()}; {len(texts)} texts (long mix), {args.threads} threads, "
          f"{'CPU' if args.cpu_time else 'wall'} time")
    rates: dict[tuple, list[float]] = {side: [] for side in sides}
    outputs = {}
    for index in range(args.rounds):
        for name, on in (sides if index % 2 == 0 else list(reversed(sides))):
            attention_cpu.BF16_ENABLED = on
            start = clock()
            out = engines[name].embed(texts, use_tqdm=False)
            rates[(name, on)].append(len(texts) / (clock() - start))
            outputs[(name, on)] = np.stack([o.embedding for o in out]).astype(np.float64)
        attention_cpu.BF16_ENABLED = True
        print(f"round {index + 1}: " + ", ".join(
            f"{n} {'on' if on else 'off'} {rates[(n, on)][-1]:.1f}" for n, on in sides)
            + f" texts/s; load average {os.getloadavg()[0]:.1f}")
    ref = outputs[("fp32", True)]
    for side in sides[1:]:
        ratio = statistics.median(r / f for r, f in zip(rates[side], rates[("fp32", True)]))
        x = outputs[side]
        cos = (x * ref).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(ref, axis=1)
        print(f"{side[0]} with the bf16 attention kernel {'on' if side[1] else 'off'}: "
              f"{ratio:.2f}x fp32 (median of rounds), min cosine to fp32 {cos.min():.5f}")


if __name__ == "__main__":
    main()
