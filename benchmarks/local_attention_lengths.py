"""One local attention layer by sequence length: the full L x L product under a band mask (what
packed_attention did before the band: `_band_mask` + SDPA) against the C kernel's band and the
torch path's blocked band, alternating in one process; then each path's peak RSS in a fresh
process per (path, length).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/local_attention_lengths.py
        [--lengths 1024,2048,4096,8192] [--heads 12] [--dim 64] [--window 128] [--rounds 3]
        [--threads N] [--no-memory]

Shapes default to a ModernBERT-base local layer: 12 heads x 64, local_attention 128 (query i
sees keys |i - j| <= 64), q/k/v as views of one fused [L, 3, heads, dim] projection. A cell is
the median of the fastest round's calls, in ms; "x" columns are the masked product's time over
the path's. Also printed: the largest difference of each path from the masked product, the CPU
kind and the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PATHS = ("masked", "kernel", "torch")


def _inputs(length: int, heads: int, dim: int):
    import torch

    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(length, 3, heads, dim, generator=g)  # [L, 3, heads, dim]
    cu = torch.tensor([0, length], dtype=torch.int32)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2], cu


def _call(path: str, q, k, v, cu, half_window: int):
    import torch
    import torch.nn.functional as F

    from pooler.kernels import attention_cpu
    from pooler.layers.attention import _band_mask, packed_attention

    length, heads, dim = q.shape
    if path == "masked":  # the previous torch path for one sequence of a local layer
        qs, ks, vs = (t.view(1, length, heads, dim).transpose(1, 2) for t in (q, k, v))
        mask = _band_mask(length, half_window, False, "cpu")
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=dim ** -0.5)
        return o.transpose(1, 2).reshape(length, heads, dim)
    attention_cpu.ENABLED = path == "kernel"
    try:
        with torch.inference_mode():
            return packed_attention(q, k, v, [length], cu, length, half_window=half_window,
                                    scale=dim ** -0.5)
    finally:
        attention_cpu.ENABLED = True


def _high_water_mb() -> float:
    """The process's peak RSS (VmHWM: its own address space; ru_maxrss would carry the forking
    parent's peak across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def _peak_rss(args, path: str, length: int) -> tuple[float, float]:
    """(MB of peak RSS before, and after one call of `path`) in a fresh process that made its
    inputs and warmed the path up on 64 tokens first."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            f"import local_attention_lengths as b, torch; "
            f"torch.set_num_threads({args.threads}); "
            f"q, k, v, cu = b._inputs({length}, {args.heads}, {args.dim}); "
            f"b._call({path!r}, q[:64], k[:64], v[:64], torch.tensor([0, 64], "
            f"dtype=torch.int32), {args.window // 2}); "
            f"before = b._high_water_mb(); "
            f"b._call({path!r}, q, k, v, cu, {args.window // 2}); "
            f"print(before, b._high_water_mb())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=os.environ)
    before, after = out.stdout.strip().splitlines()[-1].split()
    return float(before), float(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=128, help="ModernBERT's local_attention")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()

    import torch

    from pooler.cpu_features import cpu_features
    from pooler.kernels import build

    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    lib = build.encoder_kernels()
    half = args.window // 2
    print(f"cpu: {cpu_features().summary()}; kernel build: {lib.variant if lib else 'none'}; "
          f"{args.heads} heads x {args.dim}, window {args.window} (|i - j| <= {half}), "
          f"{args.threads} thread(s); load average {os.getloadavg()[0]:.1f}")
    print("| tokens | masked L x L (ms) | C kernel band (ms) | x | torch blocked band (ms) | x "
          "| max diff kernel / torch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for length in (int(x) for x in args.lengths.split(",")):
        q, k, v, cu = _inputs(length, args.heads, args.dim)
        results = {p: _call(p, q, k, v, cu, half) for p in PATHS}  # warm-up, and parity
        diffs = [(results[p] - results["masked"]).abs().max().item() for p in PATHS[1:]]
        # calls per round: about 1 s of the slowest path
        start = time.perf_counter()
        _call("masked", q, k, v, cu, half)
        calls = max(1, min(20, int(1.0 / (time.perf_counter() - start))))
        best = {p: float("inf") for p in PATHS}
        for _ in range(args.rounds):
            for p in PATHS:  # alternating: each round times every path once
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    _call(p, q, k, v, cu, half)
                    times.append(time.perf_counter() - t0)
                best[p] = min(best[p], statistics.median(times))
        ms = {p: 1e3 * best[p] for p in PATHS}
        print(f"| {length} | {ms['masked']:.1f} | {ms['kernel']:.2f} | "
              f"{ms['masked'] / ms['kernel']:.0f}x | {ms['torch']:.2f} | "
              f"{ms['masked'] / ms['torch']:.0f}x | {diffs[0]:.1e} / {diffs[1]:.1e} |",
              flush=True)
    if args.no_memory:
        return
    print("\npeak RSS (MB) of a fresh process per cell: before the call (inputs made, path "
          "warmed up on 64 tokens) -> after it")
    print("| tokens | " + " | ".join(PATHS) + " |")
    print("| --- |" + " --- |" * len(PATHS))
    for length in (int(x) for x in args.lengths.split(",")):
        cells = ["{:.0f} -> {:.0f}".format(*_peak_rss(args, p, length)) for p in PATHS]
        print(f"| {length} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
