"""SPLADE throughput: pooler `Engine.embed_sparse` vs sentence-transformers `SparseEncoder.encode`
on the same texts in one run (same process, same threads), after one warm-up pass each.

    python benchmarks/sparse.py [--model ../shared/models/splade-tiny] [--num-texts 500]
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[1]
_DEFAULT_MODEL = next((p for p in (_ROOT / ".." / "shared" / "models" / "splade-tiny",
                                   _ROOT / ".." / ".." / "shared" / "models" / "splade-tiny")
                       if p.is_dir()), _ROOT / ".." / "shared" / "models" / "splade-tiny")

_WORDS = ("the a of search sparse dense vector model query document weather city river market "
          "engine token retrieval learned expansion neural index term frequency paris london "
          "music history science football energy policy health travel recipe garden").split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Seeded sentences of 4 to 60 words, so the batch mixes short and long inputs."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 60))) + "."
            for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(_DEFAULT_MODEL))
    parser.add_argument("--num-texts", type=int, default=500)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    from pooler import Engine

    texts = make_texts(args.num_texts)
    engine = Engine(args.model, device=args.device, num_threads=args.threads)
    reference = SparseEncoder(modules=[MLMTransformer(args.model), SpladePooling("max")],
                              device=args.device)

    def run_pooler():
        return engine.embed_sparse(texts, use_tqdm=False)

    def run_reference():
        return reference.encode(texts, convert_to_tensor=True)

    results = {}
    for name, fn in (("pooler embed_sparse", run_pooler), ("SparseEncoder.encode", run_reference)):
        fn()  # warm-up
        start = time.perf_counter()
        fn()
        results[name] = len(texts) / (time.perf_counter() - start)
    print(f"model {args.model}, {len(texts)} texts, device {args.device}, "
          f"threads {torch.get_num_threads()}")
    for name, rate in results.items():
        print(f"{name:>22}: {rate:8.1f} texts/s")
    print(f"{'ratio pooler/ST':>22}: {results['pooler embed_sparse'] / results['SparseEncoder.encode']:8.2f}x")


if __name__ == "__main__":
    main()
