"""ColBERT rerank workload: 1 query x 100 passages and 10 queries x 100 passages each.

Model: a PyLate-layout ColBERT made from the real all-MiniLM-L6-v2 backbone with a seeded
random 96-d projection (pooler/bench/pylate_folder.py; no ColBERT ships on PyPI), cached under
~/.cache/pooler-bench. Peer: sentence-transformers' MultiVectorEncoder (v6; it loads PyLate's
layout and gives PyLate 1.6's vectors, which cannot run on sentence-transformers 6), per call:
encode the queries, encode each query's passages, MaxSim by `similarity`. pooler:
`Engine.rerank` for one query; `Engine.score` with the 10 x 100 pairs in one call for ten (each
query is encoded once)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import (cached_folder, digest, flops_per_token, minilm_path,
                                 pooler_engine, pooler_sides, save_array, timed_calls,
                                 token_lens)
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

SHAPES = {"1x100": 1, "10x100": 10}
# Timed calls per shape in a full run: a 10 x 100 call runs ~180k tokens (minutes on 2 cores).
_CALLS = {"1x100": 3, "10x100": 1}


PEER = "MultiVectorEncoder"


def model_path() -> Path:
    from pooler.bench.pylate_folder import build_pylate

    return cached_folder("colbert-pylate-layout-minilm-96-seed0",
                         lambda dest: build_pylate(dest, minilm_path(), embedding_size=96))


def _inputs(opts: BenchOptions, shape: str) -> tuple[list[str], list[list[str]]]:
    n_queries = SHAPES[shape]
    n_docs = 8 if opts.quick else 100
    queries = corpus.queries(n_queries, seed=21)
    docs = [corpus.passages(n_docs, seed=300 + i) for i in range(n_queries)]
    return queries, docs


def _calls(opts: BenchOptions, shape: str) -> int:
    return 1 if opts.quick else _CALLS[shape]


def _seq_lens(path: Path, queries: list[str], docs: list[list[str]]) -> list[int]:
    """Length of every sequence the encoder runs per call: each query expanded to
    query_length with [MASK]s, each passage with its [D] marker, truncated at
    document_length."""
    st = json.loads((path / "config_sentence_transformers.json").read_text())
    q_len, d_len = int(st.get("query_length", 32)), int(st.get("document_length", 180))
    flat = [d for ds in docs for d in ds]
    return [q_len] * len(queries) + [min(n + 1, d_len)
                                     for n in token_lens(path, flat, max_length=d_len)]


def _flops_per_token(opts: BenchOptions) -> float:
    """Over the 10 x 100 inputs (the 1 x 100 passages have the same length mix)."""
    path = model_path()
    return flops_per_token(path, _seq_lens(path, *_inputs(opts, "10x100")))


def _result(side: str, role: str, opts: BenchOptions, shape: str, path: Path, queries, docs,
            latencies: list[float], loaded: float, scores: np.ndarray) -> SideResult:
    calls = len(latencies)
    n_docs = sum(len(ds) for ds in docs)
    top = [[int(i) for i in np.argsort(-row, kind="stable")[:10]] for row in scores]
    return SideResult(side, role, calls * n_docs, calls * sum(_seq_lens(path, queries, docs)),
                      sum(latencies) / 1e3, latencies, loaded_rss_mb=loaded,
                      note=f"top-10 digest {digest(top)}",
                      outputs_file=save_array(opts, f"colbert-{side}", scores))


def _pooler(shape: str):
    def make(quantization: str | None, side: str):
        return lambda opts: _run_pooler(opts, shape, quantization, side)
    return make


def _run_pooler(opts: BenchOptions, shape: str, quantization: str | None,
                side: str) -> SideResult:
    path = model_path()
    queries, docs = _inputs(opts, shape)
    engine = pooler_engine(path, opts, quantization)

    def call() -> np.ndarray:  # [num_queries, num_docs] scores in input order
        if len(queries) == 1:
            scores = np.zeros((1, len(docs[0])), dtype=np.float32)
            for r in engine.rerank(queries[0], docs[0], use_tqdm=False):
                scores[0, r.index] = r.score
            return scores
        out = engine.score([q for q, ds in zip(queries, docs) for _ in ds],
                           [d for ds in docs for d in ds], use_tqdm=False)
        return np.array([o.score for o in out], dtype=np.float32).reshape(len(queries), -1)

    engine.rerank(queries[0], docs[0][:8], use_tqdm=False)  # warm up
    loaded = rss_mb()
    latencies, scores = timed_calls(call, _calls(opts, shape))
    return _result(side, "pooler", opts, shape, path, queries, docs, latencies, loaded,
                   scores)


def _multi_vector_encoder(shape: str):
    def run(opts: BenchOptions) -> SideResult:
        import torch
        from sentence_transformers import MultiVectorEncoder

        path = model_path()
        queries, docs = _inputs(opts, shape)
        model = MultiVectorEncoder(str(path), device="cuda" if opts.device == "cuda" else "cpu")

        def call() -> np.ndarray:
            q = model.encode_query(queries, batch_size=32, show_progress_bar=False)
            scores = np.zeros((len(queries), len(docs[0])), dtype=np.float32)
            for i, ds in enumerate(docs):
                d = model.encode_document(ds, batch_size=32, show_progress_bar=False)
                with torch.no_grad():  # one document per column: no padding enters MaxSim
                    scores[i] = [float(model.similarity(q[i:i + 1], [v])[0, 0]) for v in d]
            return scores

        model.encode_document(docs[0][:8], batch_size=32, show_progress_bar=False)  # warm up
        model.encode_query(queries[:1], show_progress_bar=False)
        loaded = rss_mb()
        latencies, scores = timed_calls(call, _calls(opts, shape))
        return _result(f"{PEER} {shape}", "peer", opts, shape, path, queries, docs,
                       latencies, loaded, scores)
    return run


def _sides(opts: BenchOptions) -> list[Side]:
    sides = []
    for shape in SHAPES:
        sides += pooler_sides(opts, _pooler(shape), suffix=f" {shape}") + [
            Side(f"{PEER} {shape}", "peer", _multi_vector_encoder(shape))]
    return sides


register(Workload(
    name="colbert",
    description="ColBERT rerank (PyLate layout on the all-MiniLM-L6-v2 backbone), 1 x 100 and "
                "10 x 100 passages per call, vs sentence-transformers MultiVectorEncoder "
                "encode + MaxSim",
    metric="throughput", sides=_sides, baseline=f"{PEER} 1x100",
    flops_per_token=_flops_per_token,
    baselines={f"{side} {s}": f"{PEER} {s}" for s in SHAPES
               for side in ("pooler", "pooler-int8", PEER)}))
