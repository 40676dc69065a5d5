"""Cross-encoder rerank workload: 1 query x 100 passages, repeated.

Model: the real all-MiniLM-L6-v2 backbone with a seeded random 1-label classification head,
saved by sentence-transformers `CrossEncoder(...).save` (real on-disk layout, realistic cost),
cached under ~/.cache/pooler-bench. Peer: `CrossEncoder.rank` (batch 32, its default)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import (cached_folder, digest, flops_per_token, minilm_path,
                                 pooler_engine, pooler_sides, save_array, timed_calls,
                                 token_lens)
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register


def model_path() -> Path:
    def build(dest: Path) -> None:
        import torch
        from sentence_transformers import CrossEncoder

        torch.manual_seed(0)  # the classification head is freshly initialized from this seed
        CrossEncoder(str(minilm_path()), num_labels=1, device="cpu").save(str(dest))
    return cached_folder("cross-encoder-minilm-seed0", build)


def _inputs(opts: BenchOptions) -> tuple[str, list[str], int]:
    """(query, passages, timed calls)."""
    query = corpus.queries(1, seed=31)[0]
    if opts.quick:
        return query, corpus.passages(8, seed=32), 1
    return query, corpus.passages(100, seed=32), 3


def _result(side: str, role: str, opts: BenchOptions, path: Path, query: str, docs: list[str],
            latencies: list[float], loaded: float, scores: np.ndarray) -> SideResult:
    calls = len(latencies)
    tokens = sum(token_lens(path, [query] * len(docs), docs))
    top = [int(i) for i in np.argsort(-scores, kind="stable")[:10]]
    return SideResult(side, role, calls * len(docs), calls * tokens, sum(latencies) / 1e3,
                      latencies, loaded_rss_mb=loaded, note=f"top-10 digest {digest(top)}",
                      outputs_file=save_array(opts, f"cross_encoder-{side}", scores[None, :]))


def _flops_per_token(opts: BenchOptions) -> float:
    path = model_path()
    query, docs, _ = _inputs(opts)
    return flops_per_token(path, token_lens(path, [query] * len(docs), docs))


def _pooler(quantization: str | None, side: str):
    def run(opts: BenchOptions) -> SideResult:
        path = model_path()
        query, docs, calls = _inputs(opts)
        engine = pooler_engine(path, opts, quantization)

        def call() -> np.ndarray:  # [num_docs] scores in input order
            scores = np.zeros(len(docs), dtype=np.float32)
            for r in engine.rerank(query, docs, use_tqdm=False):
                scores[r.index] = r.score
            return scores

        engine.rerank(query, docs[:8], use_tqdm=False)  # warm up
        loaded = rss_mb()
        latencies, scores = timed_calls(call, calls)
        return _result(side, "pooler", opts, path, query, docs, latencies, loaded, scores)
    return run


def _cross_encoder(opts: BenchOptions) -> SideResult:
    from sentence_transformers import CrossEncoder

    path = model_path()
    query, docs, calls = _inputs(opts)
    model = CrossEncoder(str(path), device="cuda" if opts.device == "cuda" else "cpu")

    def call() -> np.ndarray:
        scores = np.zeros(len(docs), dtype=np.float32)
        for r in model.rank(query, docs, batch_size=32):
            scores[int(r["corpus_id"])] = r["score"]
        return scores

    model.rank(query, docs[:8], batch_size=32)  # warm up
    loaded = rss_mb()
    latencies, scores = timed_calls(call, calls)
    return _result("CrossEncoder.rank", "peer", opts, path, query, docs, latencies, loaded,
                   scores)


register(Workload(
    name="cross_encoder",
    description="cross-encoder rerank (all-MiniLM-L6-v2 backbone, seeded 1-label head), "
                "1 query x 100 passages per call vs sentence-transformers CrossEncoder.rank",
    metric="throughput",
    sides=lambda opts: pooler_sides(opts, _pooler) + [
        Side("CrossEncoder.rank", "peer", _cross_encoder)],
    baseline="CrossEncoder.rank", flops_per_token=_flops_per_token))
