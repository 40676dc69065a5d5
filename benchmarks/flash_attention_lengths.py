"""The flash kernel (flash_attention.h) against torch's SDPA and attention.h's kernel on one
layer's fp32 global attention, by sequence length: the ratios behind attention_cpu's
FLASH_MIN_LEN and FLASH_BUILDS (docs/dev/journal.md, "Flash attention for long fp32 sequences").

    PYTHONPATH=$PWD .venv/bin/python benchmarks/flash_attention_lengths.py
        [--lengths 1024,2048,4096,8192] [--heads 12] [--dim 64] [--threads 2] [--rounds 5]
        [--kernel-up-to 4096] [--cpu-time] [--against REV]
    # the AVX2 build, torch held to AVX2 (ATen's kernels; add ONEDNN_MAX_CPU_ISA=AVX2
    # MKL_ENABLE_INSTRUCTIONS=AVX2 to hold SDPA's GEMMs there too, as on an AVX2-only CPU):
    POOLER_CPU_KERNELS=avx2 ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/flash_attention_lengths.py

q/k/v are views of one fused projection [L, 3, heads, dim] (as BERT layers give them). Each
round calls every path once per length, in turn, in this process; a cell is the fastest round.
--cpu-time times each call by the process's CPU time (with --threads 1: steadier than wall
time on a shared machine, as it leaves out the time the thread waited for a core).
Prints ms, GFLOP/s (4 L^2 heads dim) and flash / SDPA and flash / kernel time ratios (below 1:
the flash kernel is faster), the largest difference to SDPA, the build and the load average.
--against REV also times the flash kernel as git revision REV has it (built beside this one,
benchmarks/interleaved.py), as "flash@REV", with this build's time over it.
"""
from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,2048,4096,8192")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kernel-up-to", type=int, default=4096,
                        help="time attention.h's kernel up to this length (slow beyond)")
    parser.add_argument("--against", default="",
                        help="also time the flash kernel of this git revision")
    parser.add_argument("--cpu-time", action="store_true",
                        help="the process's CPU time instead of wall time (use with --threads 1)")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu
    from pooler.kernels.build import encoder_kernels

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    lib = encoder_kernels()
    flash = attention_cpu._entry_points(lib, "flash") if lib is not None else None
    if flash is None:
        raise SystemExit("no encoder kernel build with the flash entry point here")
    scale = args.dim ** -0.5
    old = _flash_at(args.against, lib) if args.against else None
    print(f"cpu: {cpu_features().summary()}; build {lib.variant}, ATEN_CPU_CAPABILITY="
          f"{os.environ.get('ATEN_CPU_CAPABILITY', '(default)')}, {args.heads} heads x "
          f"{args.dim}, {args.threads} thread(s), {'CPU' if args.cpu_time else 'wall'} time, "
          f"fastest of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f}")

    def sdpa(q, k, v):
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, L, dim]
        return F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1)

    for length in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator().manual_seed(length)
        qkv = torch.randn(length, 3, args.heads, args.dim, generator=g)
        q, k, v = qkv.unbind(1)  # [L, heads, dim] views, row stride 3 heads dim
        strides = [t.stride(0) for t in (q, k, v)]
        cu = torch.tensor([0, length], dtype=torch.int32)
        paths = {
            "flash": lambda: attention_cpu.flash_attention(flash, q, k, v, strides, [length],
                                                           scale),
            "sdpa": lambda: sdpa(q, k, v),
        }
        if old is not None:
            paths[f"flash@{args.against}"] = lambda: old(q, k, v, strides, length, scale)
        if length <= args.kernel_up_to:
            paths["kernel"] = lambda: attention_cpu.attention_on_cpu(
                q, k, v, [length], cu, scale, long_on_sdpa=False)
        diff = (paths["flash"]() - paths["sdpa"]()).abs().max().item()
        best = {name: float("inf") for name in paths}
        for _ in range(args.rounds):
            for name, call in paths.items():
                start = clock()
                call()
                best[name] = min(best[name], clock() - start)
        flops = 4.0 * length * length * args.heads * args.dim
        cells = "  ".join(f"{n} {t * 1e3:7.1f} ms {flops / t / 1e9:4.0f} GF/s"
                          for n, t in best.items())
        ratios = f"flash/sdpa {best['flash'] / best['sdpa']:.2f}"
        if "kernel" in best:
            ratios += f"  flash/kernel {best['flash'] / best['kernel']:.2f}"
        if old is not None:
            ratios += f"  flash/flash@{args.against} {best['flash'] / best[f'flash@{args.against}']:.2f}"
        print(f"L={length:5d}  {cells}  {ratios}  max|flash-sdpa| {diff:.1e}", flush=True)


def _flash_at(rev: str, like):
    """The flash kernel as revision `rev` has it: a call (q, k, v, strides, length, scale) for
    one sequence. Its scratch size took (d, threads) before one head's K and V were copied
    contiguous, then (tokens, d, threads), and (tokens, heads, d, threads) since heads are
    copied in groups."""
    import ctypes

    import torch

    from interleaved import library_at
    from pooler.kernels import attention_cpu, build

    like = attention_cpu._entry_points(like, "flash")
    cflags = build._variant(build.kernels_choice())[1]
    lib, folder = library_at(rev, "encoder_cpu.c", cflags, like, ("packed_flash_attention_f32",))
    source = (folder / "encoder_cpu.c").read_text()
    per_heads = "scratch_floats(int tokens, int heads" in source
    per_tokens = per_heads or "scratch_floats(int tokens" in source
    scratch = lib.flash_attention_scratch_floats
    scratch.restype = ctypes.c_long

    def call(q, k, v, strides, length, scale):
        threads = torch.get_num_threads()
        head_dim = q.shape[2]
        floats = (scratch(length, q.shape[1], head_dim, threads) if per_heads
                  else scratch(length, head_dim, threads) if per_tokens
                  else scratch(head_dim, threads))
        work, out = torch.empty(floats), torch.empty_like(q.contiguous())
        cu = torch.tensor([0, length], dtype=torch.int32)
        lib.packed_flash_attention_f32(q.data_ptr(), k.data_ptr(), v.data_ptr(), *strides,
                                       out.data_ptr(), q.shape[1], head_dim, 1, cu.data_ptr(),
                                       None, scale, work.data_ptr(), threads)
        return out

    return call


if __name__ == "__main__":
    main()
