"""Long global bf16 attention: attention_bf16.c's whole-sequence units (old) vs its key-block
units with an online softmax (attention_bf16_flash.h, new), with torch's SDPA in bf16 for
context, one sequence of L tokens, interleaved in one process (how
attention_cpu.BF16_FLASH_MIN_LEN was chosen; docs/dev/journal.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_bf16_tiled.py
        [--lengths 512,1024,2048,4096,8192] [--heads 12] [--dim 64] [--threads 2]
        [--rounds 5] [--modes bf16,int8]

Modes: bf16 (the bf16 engine: bf16 q/k/v, P@V in fp32, bf16 out) and int8 (`bf16_products`:
P rounded to bf16 for a VDPBF16PS P@V, fp32 out); q/k/v are strided views of one fused bf16
projection, as the models pass them. The SDPA bf16 route is switched off
(BF16_SDPA_ENABLED = False) so attention_on_cpu runs the kernel; old and new differ only in
BF16_FLASH_MIN_LEN (0: every sequence in whole-sequence units). Each cell: the fastest of
--rounds rounds (each side once per round, the order rotating), GFLOP/s counted as
4 L^2 heads d by wall time, and the time ratios new / old and new / SDPA bf16 (< 1: new
faster); "cpu new/old" is the same ratio by the process's CPU time (the fastest round's),
steadier on a shared machine where a thread may wait for a core.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="bf16,int8")
    args = parser.parse_args()

    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu

    if attention_cpu.bf16_attention_kernels() is None:
        raise SystemExit("the bf16 attention kernel does not run here (needs AVX512_BF16)")
    torch.set_num_threads(args.threads)
    attention_cpu.BF16_SDPA_ENABLED = False  # the kernel, whatever the length
    h, d = args.heads, args.dim
    scale = d ** -0.5
    print(f"cpu: {cpu_features().summary()}; 1 x L, {h} heads x {d}, {args.threads} threads; "
          f"load {os.getloadavg()[0]:.1f}; fastest of {args.rounds} interleaved rounds")
    print("mode  L      old GF/s  new GF/s  sdpa16 GF/s  new/old  new/sdpa16  cpu new/old")
    for mode in args.modes.split(","):
        products = mode == "int8"
        for length in (int(x) for x in args.lengths.split(",")):
            g = torch.Generator().manual_seed(length)
            fused = torch.randn(length, 3 * h * d, generator=g).to(torch.bfloat16)
            q, k, v = (fused[:, i * h * d:(i + 1) * h * d].view(length, h, d)
                       for i in range(3))  # [L, heads, d] strided views
            cu = torch.tensor([0, length], dtype=torch.int32)

            def kernel(flash_min: int):
                def run():
                    attention_cpu.BF16_FLASH_MIN_LEN = flash_min
                    return attention_cpu.attention_on_cpu(q, k, v, [length], cu, scale,
                                                          bf16_products=products)
                return run

            def sdpa():
                qs, ks, vs = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, h, L, d]
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1)
                return o.float() if products else o

            sides = {"old": kernel(0), "new": kernel(1), "sdpa16": sdpa}
            best = dict.fromkeys(sides, float("inf"))
            cpu = dict.fromkeys(sides, float("inf"))
            for side in sides.values():
                side()  # warm-up (builds, page faults)
            for r in range(args.rounds):
                order = list(sides)
                order = order[r % 3:] + order[:r % 3]
                for name in order:
                    t0, c0 = time.perf_counter(), time.process_time()
                    sides[name]()
                    best[name] = min(best[name], time.perf_counter() - t0)
                    cpu[name] = min(cpu[name], time.process_time() - c0)
            flops = 4 * length * length * h * d
            gf = {n: flops / t / 1e9 for n, t in best.items()}
            print(f"{mode:5} {length:<6} {gf['old']:8.0f}  {gf['new']:8.0f}  "
                  f"{gf['sdpa16']:11.0f}  {best['new'] / best['old']:7.2f}  "
                  f"{best['new'] / best['sdpa16']:10.2f}  {cpu['new'] / cpu['old']:11.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
