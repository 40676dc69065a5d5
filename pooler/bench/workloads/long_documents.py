"""Long documents (several times the model's max length): chunked embedding and late chunking,
pooler vs doing the same by hand with sentence-transformers (its tokenizer for the windows and
offsets, its modules for the forward pass, batch 32). Tokens/s counts every window's tokens."""
from __future__ import annotations

import time

import numpy as np
import torch

from pooler.bench import corpus
from pooler.bench.common import pooler_engine, save_array
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register


def _documents(opts: BenchOptions) -> list[str]:
    """Documents of ~40 sentences (~700-900 MiniLM tokens: 3-4 windows of 256)."""
    count = 4 if opts.quick else 60
    return [" ".join(corpus.passages(8, seed=100 + i)) for i in range(count)]


def _windows(ids: list[int], max_len: int) -> list[tuple[list[int], int, int]]:
    """[CLS] + content slice + [SEP] windows, no overlap: (window ids, content start, end)."""
    content, room, out = ids[1:-1], max_len - 2, []
    for start in range(0, len(content), room):
        piece = content[start:start + room]
        out.append(([ids[0]] + piece + [ids[-1]], start, start + len(piece)))
    return out


def _st_forward(model, batches: list[list[int]]) -> list[torch.Tensor]:
    """Token embeddings of each window: sentence-transformers' Transformer module on padded
    batches of 32."""
    out = []
    for i in range(0, len(batches), 32):
        chunk = batches[i:i + 32]
        width = max(len(x) for x in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, x in enumerate(chunk):
            ids[row, :len(x)] = torch.tensor(x)
            mask[row, :len(x)] = 1
        with torch.no_grad():
            features = model[0]({"input_ids": ids, "attention_mask": mask,
                                 "token_type_ids": torch.zeros_like(ids)})
        tokens = features["token_embeddings"]  # [batch, width, hidden]
        out += [tokens[row, :len(x)] for row, x in enumerate(chunk)]
    return out


# ---- chunked embedding --------------------------------------------------------------------
def _pooler_chunked(opts: BenchOptions) -> SideResult:
    docs = _documents(opts)
    engine = pooler_engine(opts.model, opts)
    engine.embed(docs[:2], long_input="chunk", use_tqdm=False)  # warm up
    loaded = rss_mb()
    start = time.perf_counter()
    out = engine.embed(docs, long_input="chunk", use_tqdm=False)
    seconds = time.perf_counter() - start
    return SideResult("pooler", "pooler", len(docs), sum(o.num_tokens for o in out), seconds,
                      loaded_rss_mb=loaded, outputs_file=save_array(
                          opts, "chunked-pooler", np.stack([o.embedding for o in out])))


def _st_chunked(opts: BenchOptions) -> SideResult:
    from sentence_transformers import SentenceTransformer

    from pooler.model_folder import resolve_model_path

    docs = _documents(opts)
    model = SentenceTransformer(str(resolve_model_path(opts.model)), device="cpu")
    max_len = model.max_seq_length
    loaded = rss_mb()
    start = time.perf_counter()
    per_doc = [_windows(model.tokenizer(d)["input_ids"], max_len) for d in docs]
    flat = [w for windows in per_doc for w, _, _ in windows]
    tokens = _st_forward(model, flat)
    vectors, k = [], 0
    for windows in per_doc:
        pooled = [tokens[k + i].mean(0) for i in range(len(windows))]
        weights = torch.tensor([float(e - s) for _, s, e in windows])
        k += len(windows)
        v = (torch.stack(pooled) * weights[:, None]).sum(0) / weights.sum()
        vectors.append(torch.nn.functional.normalize(v, dim=0).numpy())
    seconds = time.perf_counter() - start
    return SideResult("st-by-hand", "peer", len(docs), sum(len(w) for w in flat), seconds,
                      loaded_rss_mb=loaded, note="windows of max_seq_length, batch 32",
                      outputs_file=save_array(opts, "chunked-st", np.stack(vectors)))


# ---- late chunking ------------------------------------------------------------------------
def _pooler_late(opts: BenchOptions) -> SideResult:
    docs = _documents(opts)
    engine = pooler_engine(opts.model, opts)
    engine.embed_chunks(docs[0], window_overlap=0, use_tqdm=False)  # warm up
    loaded = rss_mb()
    start = time.perf_counter()
    out = [engine.embed_chunks(d, window_overlap=0, use_tqdm=False) for d in docs]
    seconds = time.perf_counter() - start
    vectors = np.stack([c.embedding for chunks in out for c in chunks])
    tokens = sum(len(engine.tokenizer.encode_batch([d])[0].input_ids) for d in docs)
    return SideResult("pooler", "pooler", len(docs), tokens, seconds, loaded_rss_mb=loaded,
                      note=f"{len(vectors)} sentence chunks",
                      outputs_file=save_array(opts, "late-pooler", vectors))


def _st_late(opts: BenchOptions) -> SideResult:
    """By hand: tokenize with offsets, windows without overlap (a token's vector from the one
    window holding it), mean of each sentence's token vectors, normalized."""
    from sentence_transformers import SentenceTransformer

    from pooler.engine.long_inputs import sentence_spans
    from pooler.model_folder import resolve_model_path

    docs = _documents(opts)
    model = SentenceTransformer(str(resolve_model_path(opts.model)), device="cpu")
    max_len = model.max_seq_length
    loaded = rss_mb()
    start = time.perf_counter()
    vectors, tokens_run = [], 0
    for doc in docs:
        enc = model.tokenizer(doc, return_offsets_mapping=True)
        windows = _windows(enc["input_ids"], max_len)
        token_vectors = torch.cat([t[1:-1] for t in _st_forward(model, [w for w, _, _ in
                                                                      windows])])
        tokens_run += sum(len(w) for w, _, _ in windows)
        offsets = enc["offset_mapping"][1:-1]
        for s, e in sentence_spans(doc):
            inside = [i for i, (a, b) in enumerate(offsets) if a < e and b > s]
            v = token_vectors[inside].mean(0)
            vectors.append(torch.nn.functional.normalize(v, dim=0).numpy())
    seconds = time.perf_counter() - start
    return SideResult("st-by-hand", "peer", len(docs), tokens_run, seconds,
                      loaded_rss_mb=loaded, note="windows of max_seq_length, batch 32",
                      outputs_file=save_array(opts, "late-st", np.stack(vectors)))


register(Workload(
    name="long_chunked",
    description="embed 60 long documents (3-4 windows each) with long_input='chunk' vs "
                "sentence-transformers window by window by hand",
    metric="throughput",
    sides=lambda opts: [Side("pooler", "pooler", _pooler_chunked),
                        Side("st-by-hand", "peer", _st_chunked)],
    baseline="st-by-hand"))

register(Workload(
    name="late_chunking",
    description="late chunking of 60 long documents into sentence vectors (embed_chunks) vs "
                "sentence-transformers token embeddings pooled by hand",
    metric="throughput",
    sides=lambda opts: [Side("pooler", "pooler", _pooler_late),
                        Side("st-by-hand", "peer", _st_late)],
    baseline="st-by-hand"))
