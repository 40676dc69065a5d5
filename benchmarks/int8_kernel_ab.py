"""int8_gemm.c as a git revision has it against the working tree's, in one int8 engine: the old
source is compiled beside the new one and the int8 layers are pointed at either build in
alternating rounds over the long mix (or --corpus mixed), with fp32 rounds in between (for the
ratio to fp32), so load drift on a shared machine hits every side alike. Both builds must pack
weights alike (the packed panels are made once, by the working tree's build). An older build
without int8_linear's outlier ratio ignores it (it sits in a float register); one without its
fused LayerNorm gets the call without those arguments, and its side runs the norms in torch
(quantization.FUSED_NORM off).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/int8_kernel_ab.py [--rev HEAD] [--threads 2]
        [--rounds 3] [--corpus long|mixed]
        [--cpu-time]  # CPU seconds (use with --threads 1): steadier when shared

Prints texts/s per side and round, the medians of new / old and of each against fp32, the max
|difference| between the two builds' embeddings, the CPU kind and the load average."""
from __future__ import annotations

import argparse

import numpy as np

from interleaved import (add_round_arguments, clock_label, corpus_texts, library_at,
                         median_ratio, run_rounds)


def _old_build(rev: str, path: str):
    """The int8 library compiled from `rev`'s int8_gemm.c (and its headers), for `path`."""
    from pooler.kernels import int8_cpu

    cflags = next(c for name, _, c in int8_cpu._VARIANTS if name == path)
    lib, folder = library_at(rev, "int8_gemm.c", cflags, int8_cpu.load_build(path),
                             ("int8_levels", "int8_packed_bytes", "pack_int8_weight",
                              "int8_scratch_bytes", "int8_linear"))
    lib.variant, lib.levels = path, lib.int8_levels()
    lib.fused_norm = "ln_eps" in (folder / "int8_gemm.c").read_text()
    if lib.fused_norm:
        return lib
    types = lib.int8_linear.argtypes  # the call without (ln_w, ln_b, ln_eps)
    lib.int8_linear.argtypes = types[:14] + types[17:]
    return _WithoutNormArguments(lib)


class _WithoutNormArguments:
    """A build from before int8_linear took (ln_w, ln_b, ln_eps): the call without them."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def int8_linear(self, *args):
        *head, ln_w, _ln_b, _ln_eps, scratch, threads = args
        assert ln_w is None, "an old build has no fused norm: run its side with FUSED_NORM off"
        return self._lib.int8_linear(*head, scratch, threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="HEAD", help="the git revision to compare against")
    add_round_arguments(parser)
    args = parser.parse_args()

    import torch

    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.kernels import int8_cpu
    from pooler.layers import quantization
    from pooler.model_folder import DEFAULT_MODEL

    torch.set_num_threads(args.threads)
    path = int8_cpu.int8_path()
    if path == "torch":
        raise SystemExit(f"cpu: {cpu_features().summary()}: no int8 C build runs here")
    builds = {"new": int8_cpu.load_build(path), "old": _old_build(args.rev, path)}
    builds["new"].fused_norm = True
    texts = corpus_texts(args)
    fp32 = Engine(DEFAULT_MODEL, device="cpu", num_threads=args.threads)
    int8 = Engine(DEFAULT_MODEL, device="cpu", num_threads=args.threads, quantization="int8",
                  precision_check="off")
    fp32.embed(texts[:32], use_tqdm=False)
    int8.embed(texts[:32], use_tqdm=False)  # packs the weights (the new build)
    print(f"cpu: {cpu_features().summary()}; int8 path {path}; {len(texts)} texts ({args.corpus}), "
          f"{clock_label(args)}; old = {args.rev}")

    def embed(side: str) -> list:
        if side == "fp32":
            return fp32.embed(texts, use_tqdm=False)
        lib = builds[side]
        quantization.load_build = lambda _path: lib
        quantization.FUSED_NORM = lib.fused_norm
        return int8.embed(texts, use_tqdm=False)

    rates, outputs = run_rounds(["fp32", "new", "old"], embed, texts, args)
    print(f"new / old: {median_ratio(rates, 'new', 'old'):.3f}x (median of rounds)")
    print(f"new / fp32: {median_ratio(rates, 'new', 'fp32'):.2f}x, "
          f"old / fp32: {median_ratio(rates, 'old', 'fp32'):.2f}x")
    print(f"max |new - old| over the embeddings: "
          f"{float(np.abs(outputs['new'] - outputs['old']).max()):.2e}")


if __name__ == "__main__":
    main()
