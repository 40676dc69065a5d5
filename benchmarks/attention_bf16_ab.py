"""The bf16 attention kernel (pooler/kernels/attention_bf16.c) on and off, for the int8 and the
bf16 engines, against fp32, in one process: interleaved rounds over the long mix (or --corpus
mixed), each engine
run with the kernel on and off in alternating order, so load drift hits every side alike.
With --rev REV the "off" side is the kernel as git revision REV has it instead (compiled beside
the working tree's): an A/B of a change to the kernel.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/attention_bf16_ab.py [--threads 2] [--rounds 3]
        [--corpus long|mixed] [--rev REV]
        [--cpu-time]  # CPU seconds (use with --threads 1): steadier on a shared machine

Prints texts/s per side and round, each side's ratio to fp32 (median over rounds), min cosine
to fp32 per side, the CPU kind and the load average. Needs AVX512_BF16 (else it says so)."""
from __future__ import annotations

import argparse

import numpy as np

from interleaved import (add_round_arguments, attention_builds, clock_label, corpus_texts,
                         median_ratio, run_rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", help="compare against this git revision's kernel instead of "
                                      "the kernel off")
    add_round_arguments(parser)
    args = parser.parse_args()

    import torch

    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.kernels import attention_cpu
    from pooler.model_folder import DEFAULT_MODEL

    torch.set_num_threads(args.threads)
    cpu = cpu_features()
    if attention_cpu.bf16_attention_kernels() is None:
        print(f"cpu: {cpu.summary()}: the bf16 attention kernel does not run here")
        return
    texts = corpus_texts(args)
    common = dict(device="cpu", num_threads=args.threads, precision_check="off")
    engines = {"fp32": Engine(DEFAULT_MODEL, device="cpu", num_threads=args.threads),
               "int8": Engine(DEFAULT_MODEL, quantization="int8", **common),
               "bf16": Engine(DEFAULT_MODEL, dtype="bfloat16", **common)}
    sides = [("fp32", True), ("int8", True), ("int8", False), ("bf16", True), ("bf16", False)]
    for engine in engines.values():
        engine.embed(texts[:32], use_tqdm=False)  # warm up, pack weights
    print(f"cpu: {cpu.summary()}; {len(texts)} texts ({args.corpus}), {clock_label(args)}")
    new_build = attention_cpu._bf16_build
    old = None if args.rev is None else attention_builds("bf16", args.rev)[args.rev]
    off = "off" if old is None else args.rev

    def embed(side: tuple[str, bool]) -> list:
        if old is None:
            attention_cpu.BF16_ENABLED = side[1]
        elif not side[1]:
            attention_cpu._bf16_build = lambda: old
        try:
            return engines[side[0]].embed(texts, use_tqdm=False)
        finally:
            attention_cpu.BF16_ENABLED = True
            attention_cpu._bf16_build = new_build

    rates, outputs = run_rounds(sides, embed, texts, args,
                                label=lambda s: f"{s[0]} {'on' if s[1] else off}")
    ref = outputs[("fp32", True)]
    for side in sides[1:]:
        x = outputs[side]
        cos = (x * ref).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(ref, axis=1)
        kernel = "on" if side[1] else off
        print(f"{side[0]} with the bf16 attention kernel {kernel}: "
              f"{median_ratio(rates, side, ('fp32', True)):.2f}x fp32 (median of rounds), "
              f"min cosine to fp32 {cos.min():.5f}")
    if old is not None:
        for name in ("int8", "bf16"):
            print(f"{name}: working tree / {args.rev}: "
                  f"{median_ratio(rates, (name, True), (name, False)):.3f}x (median of rounds)")


if __name__ == "__main__":
    main()
