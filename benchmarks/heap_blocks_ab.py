"""A long document's forward with its 32 MB blocks from the heap (pooler/worker/memory.py's
large_blocks_from_heap, and the rotary encoders' plain MLP into the shared workspace) against
glibc's mmap of each block, one child process per side, alternating.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/heap_blocks_ab.py \\
        [--arch jina-v3] [--length 8192] [--pairs 3] [--threads 2]

Why processes and not rounds in one: once a forward has served its blocks from the heap, the
heap keeps them in its free lists, and glibc serves a later large block from there before it
mmaps one, so an "mmap" round after a "heap" round in the same process would reuse them too.
Each child loads the bench's model (pooler/bench/long_folders.py), embeds a warm-up document of
the same length, then times one document and prints its wall seconds, the page faults during
that call (ru_minflt) and the process's peak RSS (model load included). "mmap" is the code
before the change (the scope a no-op, the plain MLP's fc1 through oneDNN's fused GELU into a
fresh block). Prints each pair's mmap / heap time (> 1: heap faster) and their median.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time


def child(side: str, arch: str, length: int, threads: int) -> None:
    import resource

    import torch

    torch.set_num_threads(threads)
    if side == "mmap":
        from pooler.models import rotary_encoder
        from pooler.worker import model_runner

        model_runner.large_blocks_from_heap = lambda active=True: contextlib.nullcontext()
        inner = rotary_encoder.RotaryMLP.inner
        rotary_encoder.RotaryMLP.inner = lambda self, x, workspace=None: inner(
            self, x, workspace if self.gated else None)
    from pooler.bench.common import pooler_engine
    from pooler.bench.long_folders import long_folder
    from pooler.bench.registry import BenchOptions
    from pooler.bench.workloads.long_context import documents

    folder = long_folder(arch, tiny=False)
    engine = pooler_engine(folder, BenchOptions(model=str(folder), threads=threads))
    engine.embed(documents(folder, length, 1, seed=1), use_tqdm=False)
    doc = documents(folder, length, 1)[0]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    emb = engine.embed([doc], use_tqdm=False)[0].embedding
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"side": side, "seconds": seconds, "faults": usage.ru_minflt - faults,
                      "peak_rss_mb": usage.ru_maxrss / 1024, "first": float(emb[0])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="jina-v3")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=("mmap", "heap"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.arch, args.length, args.threads)
        return
    ratios = []
    for pair in range(args.pairs):
        got = {}
        for side in (("mmap", "heap") if pair % 2 == 0 else ("heap", "mmap")):
            out = subprocess.run(
                [sys.executable, __file__, "--child", side, "--arch", args.arch, "--length",
                 str(args.length), "--threads", str(args.threads)],
                capture_output=True, text=True, check=True).stdout
            got[side] = json.loads(out.strip().splitlines()[-1])
            r = got[side]
            print(f"pair {pair + 1} {side}: {r['seconds']:.2f} s, {r['faults']} page faults, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
        assert abs(got["mmap"]["first"] - got["heap"]["first"]) < 1e-4, "outputs differ"
        ratios.append(got["mmap"]["seconds"] / got["heap"]["seconds"])
    print(f"{args.arch} {args.length}: mmap / heap time per pair "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
