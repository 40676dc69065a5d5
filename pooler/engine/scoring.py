"""Scoring (query, document) pairs with whatever the model is: ColBERT, cross-encoder or
bi-encoder. The offline API (`Engine.score` / `Engine.rerank`), the CLI and the HTTP server
share this module.

ColBERT runs in two stages through the engine: every distinct query once as `cache_query`
(uses = how many documents it is scored against), then every document as `score_doc`; the
pooling runner's late-interaction runner turns each document's output into its MaxSim score.
Cache keys are fresh UUIDs, never derived from a client's ids. If the call is cancelled or
fails before its documents were submitted, the queries it cached are dropped once the engine
has quiesced its requests; once the documents are submitted, each document releases its own
use (scored, failed or aborted), so nothing is left behind either way.
"""
from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.engine.engine_loop import CancelledBeforeSubmit, RequestCancelled
from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.outputs import RerankResult, ScoreOutput, as_numpy
from pooler.params import LateInteractionParams, PoolingParams



class ScoringEngine(Protocol):
    """The few things scoring needs of the engine (pooler.engine.llm.Engine provides them):
    scoring depends on this interface, the engine on scoring, never both ways."""
    model_config: Any
    processor: Any
    colbert_inputs: Any

    @property
    def supported_tasks(self) -> frozenset[str]: ...
    def verify_params(self, params: PoolingParams) -> PoolingParams: ...
    def run_processed(self, processed: list, params: list[PoolingParams], priority: int = 0,
                      use_tqdm: bool | None = None, **kwargs) -> list: ...
    def classify(self, inputs: Any, **kwargs) -> list: ...
    def drop_cached_queries(self, keys: list[str]) -> None: ...

SCORING_KINDS = ("late_interaction", "cross_encoder", "bi_encoder")


@dataclass
class ScoreRequest:
    queries: list[str | list[int]]
    documents: list[str | list[int]]
    pairs: list[tuple[int, int]]  # (query index, document index) per output


def pair_inputs(queries: Any, documents: Any) -> ScoreRequest:
    """1:1, 1:N (one query, many documents) or N:N (zipped); anything else is an error."""
    qs = normalize_inputs(queries, "queries")
    ds = normalize_inputs(documents, "documents")
    if len(qs) == 1:
        pairs = [(0, j) for j in range(len(ds))]
    elif len(qs) == len(ds):
        pairs = [(i, i) for i in range(len(ds))]
    else:
        raise ValueError(f"score takes 1 query and N documents, or N queries and N documents "
                         f"(scored pairwise); got {len(qs)} queries and {len(ds)} documents.")
    return ScoreRequest(qs, ds, pairs)


def scoring_kind(engine: ScoringEngine) -> str:
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


def score(engine: ScoringEngine, queries: Any, documents: Any, *, truncate: bool = True,
          truncate_prompt_tokens: int | None = None, use_tqdm: bool | None = None,
          priority: int = 0, cancel: threading.Event | None = None,
          use_activation: bool | None = None) -> list[ScoreOutput]:
    """use_activation=False gives a cross-encoder's raw logit (TEI's raw_scores)."""
    request = pair_inputs(queries, documents)
    kind = scoring_kind(engine)
    if use_activation is False and kind != "cross_encoder":
        raise ValueError("Raw scores (use_activation=False / raw_scores=true) apply to "
                         f"cross-encoders only; this model scores by {kind.replace('_', ' ')}.")
    truncation = TruncationOptions(truncate, truncate_prompt_tokens)
    if kind == "late_interaction":
        scores = _late_interaction_scores(engine, request, use_tqdm, priority, cancel)
    elif kind == "bi_encoder":
        scores = _bi_encoder_scores(engine, request, truncation, use_tqdm, priority, cancel)
    else:
        scores = _cross_encoder_scores(engine, request, truncate, truncate_prompt_tokens,
                                       use_tqdm, priority, use_activation)
    return [ScoreOutput(float(s), qi, di) for s, (qi, di) in zip(scores, request.pairs)]


def rerank(engine: ScoringEngine, query: Any, documents: Sequence, *, top_n: int | None = None,
           return_documents: bool = False, **kwargs) -> list[RerankResult]:
    if isinstance(query, (list, tuple)) and query and not isinstance(query[0], int):
        raise ValueError("rerank takes one query (a string or token ids), got a list of "
                         f"{len(query)}; use score() for many queries.")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                              or top_n <= 0):
        raise ValueError(f"top_n must be a positive integer (or None for all), got {top_n!r}.")
    docs = normalize_inputs(documents, "documents")
    outputs = score(engine, query, docs, **kwargs)
    ranked = sorted(outputs, key=lambda o: (-o.score, o.document_index))[:top_n]
    return [RerankResult(o.document_index, o.score,
                         _as_text(docs[o.document_index]) if return_documents else None)
            for o in ranked]


# ---- ColBERT ---------------------------------------------------------------------------------
def _late_interaction_scores(engine: ScoringEngine, request: ScoreRequest, use_tqdm, priority,
                             cancel) -> list[float]:
    builder = engine.colbert_inputs
    used = sorted({qi for qi, _ in request.pairs})
    # Distinct queries are encoded once; each gets a fresh key no client can guess or reuse.
    key_of: dict[int, str] = {}
    by_content: dict[Any, str] = {}
    for qi in used:
        content = _hashable(request.queries[qi])
        key_of[qi] = by_content.setdefault(content, uuid.uuid4().hex)
    uses: dict[str, int] = {}
    for qi, _ in request.pairs:
        uses[key_of[qi]] = uses.get(key_of[qi], 0) + 1
    first_of_key = {}
    for qi in used:
        first_of_key.setdefault(key_of[qi], qi)
    query_indices = list(first_of_key.values())

    # Build everything before submitting anything: bad input fails with nothing cached.
    query_inputs = builder.build([request.queries[qi] for qi in query_indices], "query")
    doc_inputs = builder.build([request.documents[di] for _, di in request.pairs], "document")
    query_params = [_colbert_params(engine, item, "query", LateInteractionParams(
        "cache_query", key_of[qi], uses[key_of[qi]])) for qi, item in
        zip(query_indices, query_inputs)]
    doc_params = [_colbert_params(engine, item, "document", LateInteractionParams(
        "score_doc", key_of[qi])) for (qi, _), item in zip(request.pairs, doc_inputs)]

    keys = list(uses)
    try:
        results = engine.run_processed(query_inputs, query_params, priority, use_tqdm,
                                       cancel=cancel, raise_on_error=False)
        failed = [r.error for r in results if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(results)} queries failed: {failed[0]}")
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("cancelled between the query and document stages")
    except BaseException:
        # The documents will never run: drop what the queries cached (once quiesced).
        engine.drop_cached_queries(keys)
        raise
    # From here every document releases its own use, whatever happens to it.
    try:
        results = engine.run_processed(doc_inputs, doc_params, priority, use_tqdm,
                                       cancel=cancel, raise_on_error=False)
    except RequestCancelled as exc:
        if isinstance(exc, CancelledBeforeSubmit):  # no document exists to release its use
            engine.drop_cached_queries(keys)
        raise
    except BaseException:
        # Not a per-request failure (e.g. a refused admission): nothing stays cached.
        engine.drop_cached_queries(keys)
        raise
    failed = [(i, r.error) for i, r in enumerate(results) if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} documents failed; document "
                           f"{request.pairs[failed[0][0]][1]}: {failed[0][1]}")
    return [float(r.data) for r in results]


def _colbert_params(engine: ScoringEngine, item, role: str,
                    li: LateInteractionParams) -> PoolingParams:
    extra = {ROLE_KEY: role, UNATTENDED_KEY: int(item.extra.get(UNATTENDED_KEY, 0))}
    return engine.verify_params(PoolingParams(task="token_embed", late_interaction=li,
                                              extra=extra))


# ---- bi-encoder ------------------------------------------------------------------------------
def _bi_encoder_scores(engine: ScoringEngine, request: ScoreRequest, truncation, use_tqdm,
                       priority, cancel) -> list[float]:
    used_q = sorted({qi for qi, _ in request.pairs})
    used_d = sorted({di for _, di in request.pairs})
    texts = [request.queries[i] for i in used_q] + [request.documents[j] for j in used_d]
    processed = engine.processor.process(texts, truncation=truncation)
    params = engine.verify_params(PoolingParams(task="embed"))
    results = engine.run_processed(processed, [params] * len(processed), priority, use_tqdm,
                                   cancel=cancel)
    vectors = np.stack([as_numpy(r.data) for r in results])
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    q_row = {qi: n for n, qi in enumerate(used_q)}
    d_row = {dj: len(used_q) + n for n, dj in enumerate(used_d)}
    return [float(vectors[q_row[qi]] @ vectors[d_row[di]]) for qi, di in request.pairs]


# ---- cross-encoder ---------------------------------------------------------------------------
def _cross_encoder_scores(engine: ScoringEngine, request: ScoreRequest, truncate,
                          truncate_prompt_tokens, use_tqdm, priority,
                          use_activation) -> list[float]:
    if not all(isinstance(x, str) for x in request.queries + request.documents):
        raise ValueError("A cross-encoder scores text pairs: pass queries and documents as "
                         "strings, not token ids.")
    outputs = engine.classify([request.queries[qi] for qi, _ in request.pairs],
                              text_pair=[request.documents[di] for _, di in request.pairs],
                              truncate=truncate, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm, priority=priority,
                              use_activation=use_activation)
    # One relevance label (the usual reranker): its sigmoid; else the top class probability.
    return [float(o.probs[0]) if np.asarray(o.probs).shape[0] == 1 else float(o.score)
            for o in outputs]


def _hashable(item):
    return item if isinstance(item, str) else tuple(item)


def _as_text(item) -> str | None:
    return item if isinstance(item, str) else None
