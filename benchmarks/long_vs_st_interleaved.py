"""pooler vs sentence-transformers on one whole long document, both in this process, alternating
call by call: the ratio the `long_context` bench's one-process-per-side rows cannot give on a
host whose speed drifts (the same GEMM measured 186 and 345 GFLOP/s within an hour on the shared
Xeon VM, so sides timed minutes apart carry that drift into their ratio).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/long_vs_st_interleaved.py \\
        [--arch gte] [--lengths 4096,8192] [--rounds 3] [--threads 2]

The models and documents are the bench's (pooler/bench/long_folders.py: seeded weights at the
real sizes; documents of exactly L tokens on both sides). Each round embeds the same document
once with pooler's Engine (fp32) and once with SentenceTransformer.encode (batch 1, what its
bench side picks for one document), in alternating order; both are warmed up on another
document of the same length first. Printed per round: wall seconds of each side, the process
CPU seconds of each call, and sentence-transformers' time over pooler's (> 1: pooler faster);
then the median and the best-of-rounds ratio, and the cosine of the two embeddings.

Share of the ceiling, side by side: before each side's call the round times a 2048^3 fp32 GEMM
(pooler/bench/machine.py's measure_gemm_gflops, best of 2) and the side's share is the FLOPs the
document needs (the long_context workload's count, document_flops) over its seconds, over that
GEMM rate: the rate the host gave just then, not the fastest of a drifting run. Printed per
round and as medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="gte")
    parser.add_argument("--lengths", default="4096,8192")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer

    from pooler.bench.common import pooler_engine
    from pooler.bench.machine import measure_gemm_gflops
    from pooler.bench.long_folders import long_folder
    from pooler.bench.registry import BenchOptions
    from pooler.bench.workloads.long_context import document_flops, documents

    folder = long_folder(args.arch, tiny=False)
    engine = pooler_engine(folder, BenchOptions(model=str(folder), threads=args.threads))
    st = SentenceTransformer(str(folder), device="cpu")
    print(f"{args.arch}, {args.threads} threads, step paths: {engine.step_paths()}")
    for length in (int(n) for n in args.lengths.split(",")):
        doc, warm = documents(folder, length, 1)[0], documents(folder, length, 1, seed=1)
        engine.embed(warm, use_tqdm=False)
        st.encode(warm, batch_size=1)
        ratios, wall_p, wall_s = [], [], []
        shares = {"pooler": [], "st": []}
        flops = document_flops(folder, length)
        for r in range(args.rounds):
            order = ("pooler", "st") if r % 2 == 0 else ("st", "pooler")
            got = {}
            for side in order:
                gemm = measure_gemm_gflops(args.threads, repeats=2) * 1e9
                if side == "pooler":
                    got[side] = timed(lambda: engine.embed([doc], use_tqdm=False)[0].embedding)
                else:
                    got[side] = timed(lambda: st.encode([doc], batch_size=1)[0])
                shares[side].append(flops / got[side][1] / gemm)
            (p_emb, p_wall, p_cpu), (s_emb, s_wall, s_cpu) = got["pooler"], got["st"]
            ratios.append(s_wall / p_wall)
            wall_p.append(p_wall)
            wall_s.append(s_wall)
            print(f"  {length} round {r + 1}: pooler {p_wall:.2f} s (cpu {p_cpu:.2f}), "
                  f"sentence-transformers {s_wall:.2f} s (cpu {s_cpu:.2f}), ST / pooler "
                  f"{s_wall / p_wall:.2f}; share of the GEMM rate pooler "
                  f"{shares['pooler'][-1]:.0%}, ST {shares['st'][-1]:.0%}")
        cos = float(np.dot(p_emb, s_emb) / (np.linalg.norm(p_emb) * np.linalg.norm(s_emb)))
        print(f"{args.arch} {length}: ST / pooler time, median {statistics.median(ratios):.2f}, "
              f"best-of-rounds {min(wall_s) / min(wall_p):.2f} (pooler {length / min(wall_p):.0f}"
              f" tok/s, ST {length / min(wall_s):.0f}); share of the GEMM rate, median: "
              f"pooler {statistics.median(shares['pooler']):.0%}, ST "
              f"{statistics.median(shares['st']):.0%}; cosine {cos:.6f}")


if __name__ == "__main__":
    main()
