"""Long global bf16 attention: attention_bf16.c's whole-sequence units (old) vs its key-block
units with an online softmax (attention_bf16_flash.h, new), with torch's SDPA in bf16 for
context, one sequence of L tokens, interleaved in one process (how
attention_cpu.BF16_FLASH_MIN_LEN was chosen; docs/dev/journal.md).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_bf16_tiled.py
        [--lengths 512,1024,2048,4096,8192] [--heads 12] [--dim 64] [--threads 2]
        [--rounds 5] [--modes bf16,int8] [--against REV] [--variants "FSUB=8;FPV=2"]
        [--no-old] [--no-sdpa]

Modes: bf16 (the bf16 engine: bf16 q/k/v, P@V in fp32, bf16 out), int8 (`bf16_products`:
P rounded to bf16 for a VDPBF16PS P@V, fp32 out) and int8f32 (int8 with fp32 q/k/v, as an
int8 engine's long fp32 steps pass them); q/k/v are strided views of one fused projection, as
the models pass them. The SDPA bf16 route is switched off (BF16_SDPA_ENABLED = False) so
attention_on_cpu runs the kernel; old and new differ only in BF16_FLASH_MIN_LEN (0: every
sequence in whole-sequence units). --against REV adds the key-block units as git revision REV
has them ("new@REV", built beside this tree's: benchmarks/interleaved.py); --variants adds this
tree's kernel built with other -D settings (";" between variants, "," within one: "FSUB=8",
"FSUB=8,FPV=2"), as "new[FSUB=8]". Each cell: the fastest of --rounds rounds (each side once
per round, the order rotating), GFLOP/s counted as 4 L^2 heads d by wall time, and each
side's time over new's (> 1: new faster; "new/old", "new/sdpa16" as before: < 1 new faster);
"cpu" ratios are the same by the process's CPU time (the fastest round's), steadier on a
shared machine where a thread may wait for a core. Outputs of new@REV and the variants are
checked equal to new's (the key-block layout does not change the sums).
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
    parser.add_argument("--against", default="",
                        help="also time the key-block units of this git revision")
    parser.add_argument("--variants", default="",
                        help='this tree\'s kernel built with other -D settings: "FSUB=8;FPV=2"')
    parser.add_argument("--no-old", action="store_true",
                        help="leave out the whole-sequence units (slow at 8k)")
    parser.add_argument("--no-sdpa", action="store_true", help="leave out SDPA bf16")
    args = parser.parse_args()

    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu

    if attention_cpu.bf16_attention_kernels() is None:
        raise SystemExit("the bf16 attention kernel does not run here (needs AVX512_BF16)")
    torch.set_num_threads(args.threads)
    attention_cpu.BF16_SDPA_ENABLED = False  # the kernel, whatever the length
    # the key-block units on this CPU whatever its kind (BF16_FLASH_CPU_KINDS)
    attention_cpu.BF16_FLASH_CPU_KINDS = (cpu_features().kind(),)
    builds = {"new": attention_cpu._bf16_build()}
    if args.against:
        builds[f"new@{args.against}"] = _build_at(args.against)
    for variant in filter(None, args.variants.split(";")):
        builds[f"new[{variant}]"] = _build_with(variant)
    own = attention_cpu._bf16_build
    h, d = args.heads, args.dim
    scale = d ** -0.5
    print(f"cpu: {cpu_features().summary()}; 1 x L, {h} heads x {d}, {args.threads} threads; "
          f"load {os.getloadavg()[0]:.1f}; fastest of {args.rounds} interleaved rounds, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for mode in args.modes.split(","):
        products = mode != "bf16"
        source = torch.float32 if mode == "int8f32" else torch.bfloat16
        for length in (int(x) for x in args.lengths.split(",")):
            g = torch.Generator().manual_seed(length)
            fused = torch.randn(length, 3 * h * d, generator=g).to(source)
            q, k, v = (fused[:, i * h * d:(i + 1) * h * d].view(length, h, d)
                       for i in range(3))  # [L, heads, d] strided views
            cu = torch.tensor([0, length], dtype=torch.int32)

            def kernel(flash_min: int, build):
                def run():
                    attention_cpu.BF16_FLASH_MIN_LEN = flash_min
                    attention_cpu._bf16_build = lambda: build
                    try:
                        return attention_cpu.attention_on_cpu(q, k, v, [length], cu, scale,
                                                              bf16_products=products)
                    finally:
                        attention_cpu._bf16_build = own
                return run

            def sdpa():
                qs, ks, vs = (t.transpose(0, 1)[None].to(torch.bfloat16)
                              for t in (q, k, v))  # [1, h, L, d]
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1)
                return o.float() if products else o

            sides = {name: kernel(1, build) for name, build in builds.items()}
            if not args.no_old:
                sides["old"] = kernel(0, builds["new"])
            if not args.no_sdpa:
                sides["sdpa16"] = sdpa
            best = dict.fromkeys(sides, float("inf"))
            cpu = dict.fromkeys(sides, float("inf"))
            outputs = {name: side() for name, side in sides.items()}  # warm-up (builds, faults)
            same = all(torch.equal(outputs["new"], outputs[name]) for name in builds)
            for r in range(args.rounds):
                order = list(sides)
                order = order[r % len(order):] + order[:r % len(order)]
                for name in order:
                    t0, c0 = time.perf_counter(), time.process_time()
                    sides[name]()
                    best[name] = min(best[name], time.perf_counter() - t0)
                    cpu[name] = min(cpu[name], time.process_time() - c0)
            flops = 4 * length * length * h * d
            cells = "  ".join(f"{n} {flops / t / 1e9:4.0f}" for n, t in best.items())
            ratios = []
            for name in builds:
                if name != "new":
                    ratios.append(f"{name}/new {best[name] / best['new']:.3f} "
                                  f"(cpu {cpu[name] / cpu['new']:.3f})")
            if "old" in best:
                ratios.append(f"new/old {best['new'] / best['old']:.2f} "
                              f"(cpu {cpu['new'] / cpu['old']:.2f})")
            if "sdpa16" in best:
                ratios.append(f"new/sdpa16 {best['new'] / best['sdpa16']:.2f}")
            print(f"{mode:7} L={length:<5} GF/s: {cells}  |  {'  '.join(ratios)}"
                  f"{'' if same else '  OUTPUTS DIFFER'}", flush=True)


def _build_at(rev: str):
    """attention_bf16.c as git revision `rev` has it, built with this tree's flags beside it."""
    from interleaved import attention_builds

    return attention_builds("bf16", rev)[rev]


def _build_with(variant: str):
    """This tree's attention_bf16.c built with `variant`'s -D settings ("FSUB=8,FPV=2")."""
    from pooler.kernels import attention_cpu
    from pooler.kernels.build import load_library

    defines = [f"-D{x.strip()}" for x in variant.split(",") if x.strip()]
    lib, why = load_library(attention_cpu._BF16_CFLAGS + defines, attention_cpu._BF16_SOURCE)
    if lib is None:
        raise SystemExit(f"the {variant} build failed: {why}")
    return lib


if __name__ == "__main__":
    main()
