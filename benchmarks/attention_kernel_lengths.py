"""The attention kernels alone, by sequence length: the working tree's build against the one a
git revision has, alternating in one process (the per-length tables in docs/dev/journal.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_kernel_lengths.py --rev REV
        [--kernel bf16|fp32] [--lengths 12,20,64,150,256] [--seqs 8] [--heads 12] [--dim 32]
        [--threads 1] [--rounds 3]

bf16: attention_bf16.c as an int8 engine calls it (bf16 q/k/v from the int8 QKV layer, the
probabilities rounded to bf16, an fp32 result). fp32: the fp32 kernel (encoder_cpu.c's
packed_attention_f32, attention.h) on fp32 q/k/v. Both through attention_on_cpu, as the model
calls them. Each step is --seqs sequences of L tokens; a cell is GFLOP/s (4 L^2 dim per head and
sequence) from the fastest of --rounds medians of 20 calls. Also prints whether the two builds'
outputs are equal, the CPU kind and the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from interleaved import attention_builds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the git revision to compare against")
    parser.add_argument("--kernel", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--lengths", default="12,20,64,150,256")
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu

    torch.set_num_threads(args.threads)
    builds = attention_builds(args.kernel, args.rev)
    getter = "_bf16_build" if args.kernel == "bf16" else "encoder_kernels"
    own = getattr(attention_cpu, getter)
    products = args.kernel == "bf16"
    dtype = torch.bfloat16 if products else torch.float32
    print(f"cpu: {cpu_features().summary()}; {args.kernel} kernel, {args.seqs} sequences x "
          f"{args.heads} heads x {args.dim}, {args.threads} thread(s); GFLOP/s, fastest of "
          f"{args.rounds} medians of 20 calls")

    def call(name: str, qkv: torch.Tensor, lens: list[int], cu: torch.Tensor) -> torch.Tensor:
        setattr(attention_cpu, getter, lambda: builds[name])
        try:
            return attention_cpu.attention_on_cpu(qkv[:, 0], qkv[:, 1], qkv[:, 2], lens, cu,
                                                  args.dim ** -0.5, bf16_products=products)
        finally:
            setattr(attention_cpu, getter, own)

    for length in (int(x) for x in args.lengths.split(",")):
        lens = [length] * args.seqs
        cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
        g = torch.Generator().manual_seed(length)
        qkv = torch.randn(sum(lens), 3, args.heads, args.dim, generator=g).to(dtype)
        outs = {name: call(name, qkv, lens, cu) for name in builds}
        best = {name: float("inf") for name in builds}
        for index in range(args.rounds):
            for name in (list(builds) if index % 2 == 0 else list(builds)[::-1]):
                times = []
                for _ in range(20):
                    start = time.perf_counter()
                    call(name, qkv, lens, cu)
                    times.append(time.perf_counter() - start)
                best[name] = min(best[name], statistics.median(times))
        flops = 4 * length * length * args.dim * args.heads * args.seqs
        new, old = (flops / best[name] / 1e9 for name in builds)
        same = torch.equal(*outs.values())
        print(f"{length:4d} tokens: working tree {new:6.1f}, {args.rev} {old:6.1f}, "
              f"new / old {new / old:.3f}; outputs {'equal' if same else 'DIFFER'}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
