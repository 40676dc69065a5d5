"""SPLADE workload: ../shared/models/splade-tiny on 500 texts of the mixed corpus.
Peer: sentence-transformers `SparseEncoder` (MLMTransformer + SpladePooling("max")) `encode`."""
from __future__ import annotations

import time

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import (pooler_engine, save_array, shared_model, shared_skip_reason,
                                 token_lens)
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

MODEL = "splade-tiny"


def _texts(opts: BenchOptions) -> list[str]:
    return corpus.mixed_corpus(16 if opts.quick else 500, seed=41)


def _pooler(opts: BenchOptions) -> SideResult:
    path = shared_model(MODEL)
    texts = _texts(opts)
    engine = pooler_engine(path, opts)
    engine.embed_sparse(texts[:16], use_tqdm=False)  # warm up
    loaded = rss_mb()
    start = time.perf_counter()
    out = engine.embed_sparse(texts, use_tqdm=False)
    seconds = time.perf_counter() - start
    vocab = int(engine.model_config.hf_config["vocab_size"])
    dense = np.zeros((len(out), vocab), dtype=np.float32)  # [num_texts, vocab]
    for row, o in zip(dense, out):
        row[o.indices] = o.values
    nnz = np.mean([len(o.indices) for o in out])
    return SideResult("pooler", "pooler", len(texts), sum(token_lens(path, texts)), seconds,
                      loaded_rss_mb=loaded, note=f"mean nnz {nnz:.0f}",
                      outputs_file=save_array(opts, "sparse-pooler", dense))


def _sparse_encoder(opts: BenchOptions) -> SideResult:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    path = shared_model(MODEL)
    texts = _texts(opts)
    model = SparseEncoder(modules=[MLMTransformer(str(path)), SpladePooling("max")],
                          device="cuda" if opts.device == "cuda" else "cpu")
    model.encode(texts[:16], batch_size=32)  # warm up
    loaded = rss_mb()
    start = time.perf_counter()
    emb = model.encode(texts, batch_size=32, convert_to_tensor=True)
    seconds = time.perf_counter() - start
    dense = emb.to_dense().float().cpu().numpy()  # [num_texts, vocab]
    nnz = float((dense != 0).sum(axis=1).mean())
    return SideResult("SparseEncoder", "peer", len(texts), sum(token_lens(path, texts)),
                      seconds, loaded_rss_mb=loaded, note=f"batch 32; mean nnz {nnz:.0f}",
                      outputs_file=save_array(opts, "sparse-st", dense))


register(Workload(
    name="sparse",
    description="SPLADE sparse embeddings (splade-tiny) of 500 mixed texts vs "
                "sentence-transformers SparseEncoder.encode",
    metric="throughput",
    sides=lambda opts: [Side("pooler", "pooler", _pooler),
                        Side("SparseEncoder", "peer", _sparse_encoder)],
    baseline="SparseEncoder", skip=lambda opts: shared_skip_reason(MODEL)))
