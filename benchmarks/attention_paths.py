"""packed_attention's two CPU fp32 paths for groups of equal-length sequences: the chunked matmul
path (_math_attention) against one scaled_dot_product_attention call, by group size and length.
The numbers behind attention.py's _SDPA_MAX_COUNT / _SDPA_MAX_LEN.

    python benchmarks/attention_paths.py [--threads 2]

Prints microseconds per call (best of three medians) and SDPA / matmul for 12 heads x 32
(MiniLM's shape).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pooler.bench.common import median_call_seconds  # noqa: E402
from pooler.layers.attention import _math_attention  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    heads, dim = 12, 32
    for length in (4, 8, 12, 16, 24, 32, 64, 128, 192):
        row = []
        for count in (1, 2, 8, 32):
            qkv = torch.randn(count * length, 3, heads, dim)
            # [count, heads, length, dim] views, as packed_attention makes them
            qs, ks, vs = (qkv[:, i].view(count, length, heads, dim).transpose(1, 2)
                          for i in range(3))
            out = torch.empty(count * length, heads, dim)

            def matmul_path():
                _math_attention(qs, ks, vs, dim ** -0.5, out)

            def sdpa_path():
                o = F.scaled_dot_product_attention(qs, ks, vs)
                out.view(count, length, heads, dim).copy_(o.transpose(1, 2))

            reps = max(20, 20000 // (count * length))
            warmup = max(3, reps // 10)
            matmul = min(median_call_seconds(matmul_path, reps, warmup) for _ in range(3)) * 1e6
            sdpa = min(median_call_seconds(sdpa_path, reps, warmup) for _ in range(3)) * 1e6
            row.append(f"{count} seqs: matmul {matmul:.0f} sdpa {sdpa:.0f} ({sdpa / matmul:.2f})")
        print(f"threads {args.threads} length {length:3d} | " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
