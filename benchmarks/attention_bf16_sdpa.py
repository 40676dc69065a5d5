"""Long bf16 attention: pooler's bf16 kernel (attention_bf16.c) vs torch's SDPA on bf16 q/k/v,
one sequence of L tokens, interleaved in one process (how attention_cpu.BF16_SDPA_MIN_LEN was
chosen; docs/models/precision.md, "Long documents").

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_bf16_sdpa.py
        [--lengths 512,1024,2048,4096,8192] [--seqs 1] [--heads 12] [--dim 64] [--threads 2]
        [--rounds 5] [--cases bf16,int8,local,causal,gqa,swa]

Each step is --seqs packed sequences of L tokens. Global and causal cases time the route as
attention_on_cpu runs it (_long_sequences_on_sdpa: one SDPA call per sequence, forced on
whatever the threshold and CPU) against the kernels (long_on_sdpa=False); the banded cases call SDPA
with the mask directly (no route takes them there). Cases (q/k/v as strided views of one fused
projection, as the models pass them):
- bf16: the bf16 engine (bf16 q/k/v, bf16 out): kernel vs SDPA bf16;
- int8: an int8 engine's `bf16_products` (bf16 q/k/v from the int8 QKV layer, fp32 out):
  kernel vs SDPA bf16 with the result widened;
- local: ModernBERT's local layers (half_window 64): the kernel's band vs SDPA bf16 under a
  banded bool mask;
- causal / gqa (causal, 4 kv heads) / swa (causal, 256-token window): the decoder paths a bf16
  engine takes today (widened to fp32 for the fp32 kernel's masked entry point) vs SDPA bf16
  (is_causal / enable_gqa / a banded mask).
The fp32 SDPA time on the same shape is printed as a reference. Each cell: the fastest of
--rounds rounds (each side once per round, order alternating), GFLOP/s counted as 4 L^2 d per
head (global, also for masked cases: what the masked product costs), and the ratio
kernel time / SDPA time (>1: SDPA faster).
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
    parser.add_argument("--seqs", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="bf16,int8,local,causal,gqa,swa")
    args = parser.parse_args()

    from pooler.cpu_features import cpu_features
    from pooler.kernels import attention_cpu

    torch.set_num_threads(args.threads)
    h, d = args.heads, args.dim
    scale = d ** -0.5
    attention_cpu.BF16_SDPA_MIN_LEN = 0  # the route forced for the "sdpa16" side
    attention_cpu.bf16_sdpa_is_fast = lambda: True
    print(f"cpu: {cpu_features().summary()}; {args.seqs} x L, {h} heads x {d}, "
          f"{args.threads} threads; load "
          f"{os.getloadavg()[0]:.1f}; fastest of {args.rounds} interleaved rounds")
    print("case    L      kernel s   sdpa16 s   sdpa32 s   kernel GF/s  sdpa16 GF/s  "
          "kernel/sdpa16")
    for case in args.cases.split(","):
        for length in (int(x) for x in args.lengths.split(",")):
            kv = 4 if case == "gqa" else h
            g = torch.Generator().manual_seed(length)
            n, lens = args.seqs * length, [length] * args.seqs
            fused = torch.randn(n, (h + 2 * kv) * d, generator=g).to(torch.bfloat16)
            q = fused[:, :h * d].view(n, h, d)  # [tokens, heads, d] strided views
            k = fused[:, h * d:(h + kv) * d].view(n, kv, d)
            v = fused[:, (h + kv) * d:].view(n, kv, d)
            cu = torch.arange(args.seqs + 1, dtype=torch.int32) * length
            causal = case in ("causal", "gqa", "swa")
            window = {"local": 64, "swa": 256}.get(case)
            mask = None
            if window is not None:
                i = torch.arange(length)
                diff = i[:, None] - i[None, :]
                mask = (diff.abs() <= window) if case == "local" else (diff >= 0) & (diff <= window)

            def kernel():
                return attention_cpu.attention_on_cpu(
                    q, k, v, lens, cu, scale, bf16_products=case == "int8",
                    half_window=window, causal=causal, long_on_sdpa=False)

            def sdpa(dtype=torch.bfloat16):
                if dtype == torch.bfloat16 and window is None:  # the route itself
                    return attention_cpu.attention_on_cpu(
                        q, k, v, lens, cu, scale, bf16_products=case == "int8", causal=causal)
                # [seqs, heads, L, d]
                qs, ks, vs = (t.view(args.seqs, length, -1, d).transpose(1, 2).to(dtype)
                              for t in (q, k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale,
                                                   is_causal=causal and mask is None,
                                                   enable_gqa=kv != h)
                o = o.transpose(1, 2).reshape(n, h, d)
                return o.float() if case == "int8" else o

            if kernel() is None:
                print(f"{case:6s} {length:5d}  kernel declined")
                continue
            best = {"kernel": 1e9, "sdpa16": 1e9, "sdpa32": 1e9}
            calls = {"kernel": kernel, "sdpa16": sdpa, "sdpa32": lambda: sdpa(torch.float32)}
            for r in range(args.rounds):
                for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                    start = time.perf_counter()
                    calls[name]()
                    best[name] = min(best[name], time.perf_counter() - start)
            flops = 4 * length * length * d * h * args.seqs
            ref = sdpa(torch.float32).float()
            err = (kernel().float() - ref).abs().max().item()
            err16 = (sdpa().float() - ref).abs().max().item()
            print(f"{case:6s} {length:5d}  {best['kernel']:9.4f}  {best['sdpa16']:9.4f}  "
                  f"{best['sdpa32']:9.4f}  {flops / best['kernel'] / 1e9:11.0f}  "
                  f"{flops / best['sdpa16'] / 1e9:11.0f}  {best['kernel'] / best['sdpa16']:8.2f}"
                  f"   (max err vs fp32: kernel {err:.1e}, sdpa16 {err16:.1e})", flush=True)


if __name__ == "__main__":
    main()
