"""`score` and `rerank`: (query, document) pairs scored by whatever the model is. Each kind's
scores come from its family's module: ColBERT's MaxSim (late_interaction.py), a
cross-encoder's relevance (classification.py), a bi-encoder's cosine (embedding.py), BGE-M3's
weighted scores (bge_m3.py). The offline API, the CLI and the HTTP server share this module
(through `Engine.score` / `Engine.rerank`)."""
from __future__ import annotations

import threading
from typing import Any, Sequence

from pooler.bge_m3_layout import SCORE_MODES
from pooler.engine import image_inputs, long_inputs
from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.engine.lora import with_lora
from pooler.engine.tasks.bge_m3 import bge_m3_scores
from pooler.engine.tasks.classification import cross_encoder_scores
from pooler.engine.tasks import long_scoring, page_retrieval
from pooler.engine.tasks.common import TaskEngine
from pooler.engine.tasks.embedding import bi_encoder_scores
from pooler.engine.tasks.late_interaction import late_interaction_scores
from pooler.engine.tasks.pairs import pair_inputs
from pooler.outputs import RerankResult, ScoreOutput

SCORING_KINDS = ("late_interaction", "cross_encoder", "bi_encoder", "bge_m3")


def scoring_kind(engine: TaskEngine) -> str:
    if getattr(engine.model_config, "bge_m3", None) is not None:
        return "bge_m3"
    if engine.model_config.colbert is not None:
        return "late_interaction"
    tasks = engine.supported_tasks
    if "classify" in tasks:
        return "cross_encoder"
    if "embed" in tasks:
        return "bi_encoder"
    raise ValueError(f"This model cannot score: it serves {sorted(tasks)}; scoring needs a "
                     "ColBERT model (token_embed), a cross-encoder (classify) or an embedding "
                     "model (embed).")


@with_lora
def score(engine: TaskEngine, queries: str | Sequence, documents: str | Sequence, *,
          truncate: bool = True, truncate_prompt_tokens: int | None = None,
          truncation_direction: str = "right", use_tqdm: bool | None = None,
          priority: int = 0, cancel: threading.Event | None = None,
          use_activation: bool | None = None, bge_m3_mode: str | None = None,
          bge_m3_weights: Sequence[float] | None = None,
          max_tokens_per_doc: int | None = None,
          pool_factor: float | None = None, long_input: str = "truncate",
          chunk_overlap: int | None = None,
          chunk_aggregate: str | None = None) -> list[ScoreOutput]:
    """Score (query, document) pairs: 1 query x N documents, or N x N pairwise.
    max_tokens_per_doc: cut each document to that many tokens first (vLLM's option).

    ColBERT: MaxSim of token vectors (each query encoded once); cross-encoder: the
    classifier's relevance; embedding model: cosine similarity; BGE-M3: `bge_m3_mode`
    (default "colbert+sparse+dense") with `bge_m3_weights` (see score_bge_m3). With the
    background loop running, setting `cancel` aborts the call and releases everything it
    cached.
    use_activation=False gives a cross-encoder's raw logit (TEI's raw_scores).
    truncation_direction applies where inputs are truncated (bi- and cross-encoders); ColBERT
    inputs are cut by the model's own query/document lengths.
    Page retrieval models (ColModernVBert): text queries against page images (PIL image,
    path, bytes, data URL, {"image": ...}) or texts, by MaxSim.
    pool_factor (ColBERT and page retrieval): hierarchical token pooling of each document's
    vectors before MaxSim (PyLate's pool_factor).
    long_input="chunk": a document longer than the model takes is scored in windows that
    share `chunk_overlap` tokens (default a quarter of a window) instead of being cut or
    refused; a cross-encoder's or bi-encoder's window scores are aggregated by
    `chunk_aggregate` ("max", the default, or "mean"), a ColBERT model scores MaxSim over all
    windows' token vectors (pooler/engine/tasks/long_scoring.py). Each output's num_windows
    says how many windows its document took (None without chunking)."""
    chunked = _check_long_input(long_input, chunk_overlap, chunk_aggregate)
    if page_retrieval.is_page_model(engine):
        _refuse_options(engine, use_activation=use_activation, bge_m3_mode=bge_m3_mode,
                        bge_m3_weights=bge_m3_weights, max_tokens_per_doc=max_tokens_per_doc,
                        long_input="chunk" if chunked else None)
        return page_retrieval.scores(engine, queries, documents, pool_factor=pool_factor,
                                     use_tqdm=use_tqdm, priority=priority, cancel=cancel)
    page_retrieval.pool_factor_extra(engine, pool_factor)  # refused where it cannot apply
    if image_inputs.handles(engine, queries, documents):  # texts and images: cosine
        if chunked:
            raise ValueError("long_input='chunk' applies to text scoring (cross-encoders, "
                             "bi-encoders, ColBERT), not to image-text models.")
        return image_inputs.score(engine, queries, documents, truncation=TruncationOptions(
            truncate, truncate_prompt_tokens, truncation_direction), use_tqdm=use_tqdm,
            priority=priority, cancel=cancel)
    request = pair_inputs(queries, documents)
    kind = scoring_kind(engine)
    if use_activation is False and kind != "cross_encoder":
        raise ValueError("Raw scores (use_activation=False / raw_scores=true) apply to "
                         f"cross-encoders only; this model scores by {kind.replace('_', ' ')}.")
    if kind != "bge_m3" and (bge_m3_mode is not None or bge_m3_weights is not None):
        raise ValueError("bge_m3_mode / bge_m3_weights apply to BGE-M3 models only (a folder "
                         "with colbert_linear.pt and sparse_linear.pt).")
    if max_tokens_per_doc is not None:
        if isinstance(max_tokens_per_doc, bool) or not isinstance(max_tokens_per_doc, int) \
                or max_tokens_per_doc <= 0:
            raise ValueError("max_tokens_per_doc must be a positive integer, got "
                             f"{max_tokens_per_doc!r}.")
        if kind in ("late_interaction", "bge_m3"):
            raise ValueError("max_tokens_per_doc does not apply to ColBERT models: their "
                             "documents are cut to the model's own document length.")
    truncation = TruncationOptions(truncate, truncate_prompt_tokens, truncation_direction)
    if chunked:
        return _score_chunked(engine, request, kind, truncation, chunk_overlap,
                              chunk_aggregate, use_activation, max_tokens_per_doc,
                              pool_factor, use_tqdm, priority, cancel)
    if kind == "bge_m3":
        mode = bge_m3_mode or "colbert+sparse+dense"
        if mode not in SCORE_MODES:
            raise ValueError(f"bge_m3_mode must be one of {list(SCORE_MODES)}, got {mode!r}.")
        results = bge_m3_scores(engine, request, truncation, bge_m3_weights, use_tqdm,
                                priority, cancel)
        return [ScoreOutput(r.by_mode(mode), r.query_index, r.document_index, r.num_tokens)
                for r in results]
    if kind == "late_interaction":
        scores, tokens = late_interaction_scores(engine, request, use_tqdm, priority, cancel,
                                                 pool_factor)
    elif kind == "bi_encoder":
        scores, tokens = bi_encoder_scores(engine, request, truncation, use_tqdm, priority,
                                           cancel, max_tokens_per_doc)
    else:
        scores, tokens = cross_encoder_scores(engine, request, truncation, use_tqdm,
                                              priority, use_activation, max_tokens_per_doc)
    return [ScoreOutput(float(s), qi, di, n)
            for s, n, (qi, di) in zip(scores, tokens, request.pairs)]


@with_lora
def rerank(engine: TaskEngine, query: str | Sequence[int], documents: Sequence, *,
           top_n: int | None = None, return_documents: bool = False,
           truncate: bool = True, truncate_prompt_tokens: int | None = None,
           truncation_direction: str = "right", use_tqdm: bool | None = None,
           priority: int = 0, cancel: threading.Event | None = None,
           use_activation: bool | None = None, bge_m3_mode: str | None = None,
           bge_m3_weights: Sequence[float] | None = None,
           max_tokens_per_doc: int | None = None,
           pool_factor: float | None = None, long_input: str = "truncate",
           chunk_overlap: int | None = None,
           chunk_aggregate: str | None = None) -> list[RerankResult]:
    """Documents sorted by score, best first (ties keep input order); `top_n` keeps the
    best n. The other options are score()'s (named here, so callers can see which)."""
    if isinstance(query, (list, tuple)) and query and not isinstance(query[0], int):
        raise ValueError("rerank takes one query (a string or token ids), got a list of "
                         f"{len(query)}; use score() for many queries.")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                              or top_n <= 0):
        raise ValueError(f"top_n must be a positive integer (or None for all), got {top_n!r}.")
    if page_retrieval.is_page_model(engine) or image_inputs.has_images(documents):
        docs = list(documents) if isinstance(documents, (list, tuple)) else [documents]
    else:
        docs = normalize_inputs(documents, "documents")
    outputs = score(engine, query, docs, truncate=truncate,
                    truncate_prompt_tokens=truncate_prompt_tokens,
                    truncation_direction=truncation_direction, use_tqdm=use_tqdm,
                    priority=priority, cancel=cancel, use_activation=use_activation,
                    bge_m3_mode=bge_m3_mode, bge_m3_weights=bge_m3_weights,
                    max_tokens_per_doc=max_tokens_per_doc, pool_factor=pool_factor,
                    long_input=long_input, chunk_overlap=chunk_overlap,
                    chunk_aggregate=chunk_aggregate)
    ranked = sorted(outputs, key=lambda o: (-o.score, o.document_index))[:top_n]
    return [RerankResult(o.document_index, o.score,
                         _as_text(docs[o.document_index]) if return_documents else None,
                         o.num_windows)
            for o in ranked]


def _check_long_input(long_input, chunk_overlap, chunk_aggregate) -> bool:
    """True when documents are to be chunked; the chunk options need long_input='chunk'."""
    long_inputs.check_long_input(long_input, chunk_aggregate)
    if long_input != "chunk":
        for name, value in (("chunk_overlap", chunk_overlap),
                            ("chunk_aggregate", chunk_aggregate)):
            if value is not None:
                raise ValueError(f"{name} applies with long_input='chunk'; pass "
                                 "long_input='chunk' or leave it unset.")
        return False
    if chunk_overlap is not None and (isinstance(chunk_overlap, bool)
                                      or not isinstance(chunk_overlap, int)
                                      or chunk_overlap < 0):
        raise ValueError(f"chunk_overlap must be a non-negative integer, got "
                         f"{chunk_overlap!r}.")
    return True


def _score_chunked(engine: TaskEngine, request, kind: str, truncation: TruncationOptions,
                   overlap: int | None, aggregate: str | None, use_activation,
                   max_tokens_per_doc, pool_factor, use_tqdm, priority,
                   cancel) -> list[ScoreOutput]:
    if kind == "bge_m3":
        raise ValueError("long_input='chunk' applies to cross-encoders, bi-encoders and "
                         "ColBERT models, not to BGE-M3's combined scores.")
    if kind == "late_interaction":
        if aggregate not in (None, "max"):
            raise ValueError("chunk_aggregate does not apply to ColBERT models: a long "
                             "document is scored by MaxSim over all its windows' token "
                             "vectors (each query token's best match anywhere).")
        if pool_factor is not None:
            raise ValueError("pool_factor does not apply with long_input='chunk' (yet).")
        scores, tokens, windows = long_scoring.late_interaction_window_scores(
            engine, request, overlap, use_tqdm, priority, cancel)
    elif kind == "bi_encoder":
        scores, tokens, windows = long_scoring.bi_encoder_window_scores(
            engine, request, truncation, overlap, aggregate or "max", use_tqdm, priority,
            cancel, max_tokens_per_doc)
    else:
        scores, tokens, windows = long_scoring.cross_encoder_window_scores(
            engine, request, truncation, overlap, aggregate or "max", use_activation,
            use_tqdm, priority, cancel, max_tokens_per_doc)
    return [ScoreOutput(float(s), qi, di, n, w)
            for s, n, w, (qi, di) in zip(scores, tokens, windows, request.pairs)]


def _refuse_options(engine: TaskEngine, **options) -> None:
    for name, value in options.items():
        if value is not None:
            raise ValueError(f"{name} does not apply to {engine.model_config.architecture} "
                             "(page retrieval scores by MaxSim); leave it unset.")


def _as_text(item: Any) -> str | None:
    return item if isinstance(item, str) else None
