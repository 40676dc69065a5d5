"""What quantized output vectors give up: top-10 overlap with float32 retrieval on a generated
corpus (issue 16).

    .venv/bin/python benchmarks/quantized_recall.py [--docs 3000] [--queries 200] [--model M]

Embeds a generated corpus and queries with pooler (all-MiniLM-L6-v2 by default), ranks the
corpus for every query with float32 cosine, then with each quantized precision:
int8 / uint8 (dot product of the codes; ranges calibrated on the corpus), binary (Hamming
distance of the packed bits), and binary with float32 rescoring of its top 40 (the usual
"binary first pass, rescore" recipe). Prints bytes per vector and the mean overlap of each
top-10 with float32's top-10.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from pooler import Engine
from pooler.quantize_output import quantize_embeddings

SUBJECTS = ["the engineer", "a small cat", "my neighbour", "the committee", "a tourist",
            "the old farmer", "our teacher", "a young pianist", "the city council", "a chef",
            "the startup", "a marathon runner", "the museum", "a software bug", "the storm"]
VERBS = ["repaired", "painted", "visited", "cancelled", "described", "ignored", "sold",
         "photographed", "analysed", "delayed", "celebrated", "borrowed", "cleaned", "moved"]
OBJECTS = ["the red bicycle", "a quarterly report", "the mountain cabin", "an antique clock",
           "the football stadium", "a chocolate cake", "the train schedule", "a jazz album",
           "the solar panels", "a vintage camera", "the wedding venue", "a tax return",
           "the garden fence", "a science textbook", "the harbour bridge", "a laptop screen"]
TAILS = ["before the holidays", "in the rain", "after a long meeting", "for the first time",
         "near the river", "without telling anyone", "last summer", "during the night",
         "with great care", "on a tight budget", "in front of the school", "at dawn"]


def generate(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
            f"{rng.choice(TAILS)}" for _ in range(n)]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """scores [queries, docs] (higher is better) -> [queries, k] indices, best first."""
    part = np.argpartition(-scores, k, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
    return np.take_along_axis(part, order, axis=1)


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(a, b)]))


def hamming_scores(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Packed bits [q, bytes] x [d, bytes] -> minus the Hamming distance [q, d]."""
    xor = np.bitwise_xor(queries[:, None, :], docs[None, :, :])  # [q, d, bytes]
    return -np.unpackbits(xor, axis=2).sum(axis=2, dtype=np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (bundled)")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()

    engine = Engine(args.model) if args.model else Engine()
    docs, queries = generate(args.docs, seed=0), generate(args.queries, seed=1)
    started = time.perf_counter()
    doc_vectors = np.stack([o.embedding for o in engine.embed(docs)])  # [docs, dim]
    query_vectors = np.stack([o.embedding for o in engine.embed(queries)])  # [queries, dim]
    print(f"embedded {len(docs)} docs + {len(queries)} queries in "
          f"{time.perf_counter() - started:.1f}s; dim {doc_vectors.shape[1]}")

    k = args.k
    reference = top_k(query_vectors @ doc_vectors.T, k)
    ranges = np.vstack([doc_vectors.min(0), doc_vectors.max(0)])  # calibrated on the corpus
    rows = [("float32", doc_vectors.nbytes // len(docs), 1.0)]
    for precision in ("int8", "uint8"):
        d = quantize_embeddings(doc_vectors, precision, ranges=ranges).astype(np.int32)
        q = quantize_embeddings(query_vectors, precision, ranges=ranges).astype(np.int32)
        if precision == "uint8":  # centre the codes so the dot product ranks like cosine
            d, q = d - 128, q - 128
        rows.append((precision, doc_vectors.shape[1], overlap(top_k(q @ d.T, k), reference)))
    d_bits = quantize_embeddings(doc_vectors, "ubinary")
    q_bits = quantize_embeddings(query_vectors, "ubinary")
    hamming = hamming_scores(q_bits, d_bits)  # [queries, docs]
    rows.append(("binary (Hamming)", d_bits.shape[1], overlap(top_k(hamming, k), reference)))
    candidates = top_k(hamming, 4 * k)  # [queries, 4k]
    rescored = np.take_along_axis(query_vectors @ doc_vectors.T, candidates, axis=1)
    reranked = np.take_along_axis(candidates, np.argsort(-rescored, axis=1)[:, :k], axis=1)
    rows.append((f"binary + float32 rescoring of top {4 * k}", d_bits.shape[1],
                 overlap(reranked, reference)))

    print(f"\n| precision | bytes per vector | top-{k} overlap with float32 |")
    print("| --- | --- | --- |")
    for name, size, value in rows:
        print(f"| {name} | {size} | {value:.3f} |")


if __name__ == "__main__":
    main()
