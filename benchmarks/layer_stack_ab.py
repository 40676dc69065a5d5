"""fp32 steps above 48 tokens in the C layer stack (pooler/kernels/encoder_cpu.c) against torch's
layers (oneDNN GEMMs): one fp32 engine, the two paths in alternating rounds over the long mix
(or --corpus mixed),
plus sentence-transformers at batch 32 in the same rounds as the peer.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/layer_stack_ab.py [--threads 2] [--rounds 3]
        [--corpus long|mixed] [--no-st] [--cpu-time]

To see an AVX2-only CPU's code paths on an AVX-512 machine, hold every library to AVX2 first
(the torch vector kernels, oneDNN, MKL and pooler's own builds; MKL on AMD runs AVX2 code
either way) and tell pooler the CPU has no AVX-512:

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
    POOLER_CPU_KERNELS=avx2 POOLER_CPU_FLAGS="sse4_2 avx fma avx2" python benchmarks/...

Prints texts/s per round, the C stack's speed-up over torch's layers and over
sentence-transformers (medians of per-round ratios), the largest difference of the two
paths' embeddings, and the CPU kind."""
from __future__ import annotations

import argparse
import os

import numpy as np

from interleaved import add_round_arguments, clock_label, corpus_texts, median_ratio, run_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.add_argument("--no-st", action="store_true", help="leave sentence-transformers out")
    args = parser.parse_args()

    import torch

    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.kernels import bert_cpu
    from pooler.kernels.build import encoder_kernels
    from pooler.model_folder import DEFAULT_MODEL, resolve_model_path

    torch.set_num_threads(args.threads)
    lib = encoder_kernels()
    if lib is None:
        print(f"cpu: {cpu_features().summary()}: the C layer stack does not run here")
        return
    texts = corpus_texts(args)
    engine = Engine(DEFAULT_MODEL, device="cpu", num_threads=args.threads)
    backbone = engine.core.model_runner.model.backbone
    sides = ["C stack", "torch layers"]
    st_model = None
    if not args.no_st:
        from sentence_transformers import SentenceTransformer

        st_model = SentenceTransformer(str(resolve_model_path(DEFAULT_MODEL)), device="cpu")
        st_model.encode(texts[:32], batch_size=32)
        sides.append("st b32")
    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                      "POOLER_CPU_KERNELS") if k in os.environ}
    print(f"cpu: {cpu_features().summary()}; {lib.variant} build; {env or 'no ISA limits'}; "
          f"{len(texts)} texts ({args.corpus}), {clock_label(args)}")

    class _Row:  # what run_rounds reads of an output
        def __init__(self, embedding):
            self.embedding = embedding

    def embed(side: str) -> list:
        if side == "st b32":
            return [_Row(e) for e in st_model.encode(texts, batch_size=32)]
        backbone.__dict__[bert_cpu.LARGE_STEPS] = side == "C stack"
        return engine.embed(texts, use_tqdm=False)

    embed("C stack"), embed("torch layers")  # warm up both (packs the C stack's weights)
    rates, outputs = run_rounds(sides, embed, texts, args)
    print(f"C stack: {median_ratio(rates, 'C stack', 'torch layers'):.2f}x torch layers"
          + (f", {median_ratio(rates, 'C stack', 'st b32'):.2f}x sentence-transformers b32 "
             f"(torch layers {median_ratio(rates, 'torch layers', 'st b32'):.2f}x)"
             if st_model is not None else "") + " (medians of per-round ratios)")
    diff = np.abs(outputs["C stack"] - outputs["torch layers"]).max()
    print(f"largest |difference| of the two paths' embeddings: {diff:.2e}")


if __name__ == "__main__":
    main()
