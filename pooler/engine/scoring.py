"""Scoring (query, document) pairs with whatever the model is: ColBERT, cross-encoder or
bi-encoder. The offline API (`Engine.score` / `Engine.rerank`), the CLI and the HTTP server
share this module.

ColBERT runs in two stages through the engine: every distinct query once as `cache_query`
(uses = how many documents it is scored against), then every document as `score_doc`; the
pooling runner's late-interaction runner turns each document's output into its MaxSim score.
BGE-M3 takes the same two stages: a query caches its dense vector, lexical weights and
ColBERT vectors (one forward pass), each document's output is its (dense, sparse, colbert)
scores, and the weighted combinations are made here.
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

from pooler.bge_m3_layout import BGE_M3_OUTPUTS, SCORE_MODES, check_weights
from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.engine.engine_loop import CancelledBeforeSubmit, RequestCancelled
from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.outputs import BGEM3Score, RerankResult, ScoreOutput, as_numpy
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

SCORING_KINDS = ("late_interaction", "cross_encoder", "bi_encoder", "bge_m3")


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


def score(engine: ScoringEngine, queries: Any, documents: Any, *, truncate: bool = True,
          truncate_prompt_tokens: int | None = None, truncation_direction: str = "right",
          use_tqdm: bool | None = None, priority: int = 0,
          cancel: threading.Event | None = None,
          use_activation: bool | None = None, bge_m3_mode: str | None = None,
          bge_m3_weights: Sequence[float] | None = None,
          max_tokens_per_doc: int | None = None) -> list[ScoreOutput]:
    """use_activation=False gives a cross-encoder's raw logit (TEI's raw_scores).
    truncation_direction applies where inputs are truncated (bi- and cross-encoders); ColBERT
    inputs are cut by the model's own query/document lengths.
    BGE-M3: `bge_m3_mode` picks one of SCORE_MODES (default "colbert+sparse+dense") and
    `bge_m3_weights` the (dense, sparse, colbert) weights of the combinations.
    max_tokens_per_doc: each document is cut to that many tokens before scoring."""
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
    if kind == "bge_m3":
        mode = bge_m3_mode or "colbert+sparse+dense"
        if mode not in SCORE_MODES:
            raise ValueError(f"bge_m3_mode must be one of {list(SCORE_MODES)}, got {mode!r}.")
        results = bge_m3_scores(engine, request, truncation, bge_m3_weights, use_tqdm,
                                priority, cancel)
        return [ScoreOutput(r.by_mode(mode), r.query_index, r.document_index, r.num_tokens)
                for r in results]
    if kind == "late_interaction":
        scores, tokens = _late_interaction_scores(engine, request, use_tqdm, priority, cancel)
    elif kind == "bi_encoder":
        scores, tokens = _bi_encoder_scores(engine, request, truncation, use_tqdm, priority,
                                            cancel, max_tokens_per_doc)
    else:
        scores, tokens = _cross_encoder_scores(engine, request, truncation, use_tqdm,
                                               priority, use_activation, max_tokens_per_doc)
    return [ScoreOutput(float(s), qi, di, n)
            for s, n, (qi, di) in zip(scores, tokens, request.pairs)]


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


# ---- ColBERT (and BGE-M3): queries cached once, documents scored in the runner --------------
def _late_interaction_scores(engine: ScoringEngine, request: ScoreRequest, use_tqdm, priority,
                             cancel) -> tuple[list[float], list[int]]:
    builder = engine.colbert_inputs
    results, tokens = _two_stage(engine, request, builder.build,
                                 lambda item, role, li: _colbert_params(engine, item, role, li),
                                 use_tqdm, priority, cancel)
    return [float(r.data) for r in results], tokens


def _two_stage(engine: ScoringEngine, request: ScoreRequest, build, make_params, use_tqdm,
               priority, cancel) -> list:
    """Run every distinct query once as `cache_query` (uses = its documents), then every
    document as `score_doc`; the runner's late-interaction cache turns each document's output
    into its score(s). `build(items, role)` makes the inputs, `make_params(item, role, li)`
    each request's verified params. Returns the documents' results in pair order, and each
    pair's tokens (its document's, plus its query's on the query's first pair)."""
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
    query_inputs = build([request.queries[qi] for qi in query_indices], "query")
    doc_inputs = build([request.documents[di] for _, di in request.pairs], "document")
    query_params = [make_params(item, "query", LateInteractionParams(
        "cache_query", key_of[qi], uses[key_of[qi]])) for qi, item in
        zip(query_indices, query_inputs)]
    doc_params = [make_params(item, "document", LateInteractionParams(
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
    query_tokens = {key_of[qi]: len(item.prompt_token_ids)
                    for qi, item in zip(query_indices, query_inputs)}
    return results, _pair_tokens(
        request.pairs, [len(item.prompt_token_ids) for item in doc_inputs],
        lambda qi: query_tokens[key_of[qi]], key=lambda qi: key_of[qi])


def _colbert_params(engine: ScoringEngine, item, role: str,
                    li: LateInteractionParams) -> PoolingParams:
    extra = {ROLE_KEY: role, UNATTENDED_KEY: int(item.extra.get(UNATTENDED_KEY, 0))}
    return engine.verify_params(PoolingParams(task="token_embed", late_interaction=li,
                                              extra=extra))


# ---- bi-encoder ------------------------------------------------------------------------------
def _bi_encoder_scores(engine: ScoringEngine, request: ScoreRequest, truncation, use_tqdm,
                       priority, cancel, max_tokens_per_doc: int | None = None):
    used_q = sorted({qi for qi, _ in request.pairs})
    used_d = sorted({di for _, di in request.pairs})
    doc_truncation = truncation
    if max_tokens_per_doc is not None:
        doc_truncation = TruncationOptions(True, min(max_tokens_per_doc,
                                                     engine.processor.max_model_len))
    processed = (engine.processor.process([request.queries[i] for i in used_q],
                                          truncation=truncation)
                 + engine.processor.process([request.documents[j] for j in used_d],
                                            truncation=doc_truncation))
    params = engine.verify_params(PoolingParams(task="embed"))
    results = engine.run_processed(processed, [params] * len(processed), priority, use_tqdm,
                                   cancel=cancel)
    vectors = np.stack([as_numpy(r.data) for r in results])
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    q_row = {qi: n for n, qi in enumerate(used_q)}
    d_row = {dj: len(used_q) + n for n, dj in enumerate(used_d)}
    scores = [float(vectors[q_row[qi]] @ vectors[d_row[di]]) for qi, di in request.pairs]
    lengths = [len(p.prompt_token_ids) for p in processed]
    return scores, _pair_tokens(request.pairs, [lengths[d_row[di]] for _, di in request.pairs],
                                lambda qi: lengths[q_row[qi]])


# ---- BGE-M3 ----------------------------------------------------------------------------------
def bge_m3_scores(engine: ScoringEngine, request: ScoreRequest, truncation: TruncationOptions,
                  weights: Sequence[float] | None, use_tqdm=None, priority: int = 0,
                  cancel=None) -> list[BGEM3Score]:
    """Each pair's scores as FlagEmbedding's compute_score, through the late-interaction
    cache: every distinct query runs once (its dense vector, lexical weights and ColBERT
    vectors from one forward pass stay cached), every document runs once and the runner
    scores it against its query (pooler/worker/late_interaction.py: bge_m3_scores). The
    weighted (dense, sparse, colbert) combinations are made here."""
    w_dense, w_sparse, w_colbert = check_weights(weights)
    extra = {"bge_m3": list(BGE_M3_OUTPUTS)}
    results, tokens = _two_stage(
        engine, request, lambda items, role: engine.processor.process(items, truncation=truncation),
        lambda item, role, li: engine.verify_params(PoolingParams(
            task="embed", late_interaction=li, extra=dict(extra))),
        use_tqdm, priority, cancel)
    scores = []
    for r, n, (qi, di) in zip(results, tokens, request.pairs):
        dense, sparse, colbert = (float(x) for x in r.data)  # the runner's [3] scores
        scores.append(BGEM3Score(
            dense, sparse, colbert,
            (dense * w_dense + sparse * w_sparse) / (w_dense + w_sparse),
            (dense * w_dense + sparse * w_sparse + colbert * w_colbert) /
            (w_dense + w_sparse + w_colbert), qi, di, n))
    return scores


# ---- cross-encoder ---------------------------------------------------------------------------
def _cross_encoder_scores(engine: ScoringEngine, request: ScoreRequest,
                          truncation: TruncationOptions, use_tqdm, priority, use_activation,
                          max_tokens_per_doc: int | None = None
                          ) -> tuple[list[float], list[int]]:
    if not all(isinstance(x, str) for x in request.queries + request.documents):
        raise ValueError("A cross-encoder scores text pairs: pass queries and documents as "
                         "strings, not token ids.")
    outputs = engine.classify([request.queries[qi] for qi, _ in request.pairs],
                              text_pair=[request.documents[di] for _, di in request.pairs],
                              truncate=truncation.truncate,
                              truncate_prompt_tokens=truncation.truncate_prompt_tokens,
                              truncation_direction=truncation.direction, use_tqdm=use_tqdm,
                              priority=priority, use_activation=use_activation,
                              max_pair_tokens=max_tokens_per_doc)
    # One relevance label (the usual reranker): its sigmoid; else the top class probability.
    return ([float(o.probs[0]) if np.asarray(o.probs).shape[0] == 1 else float(o.score)
             for o in outputs], [int(o.num_tokens) for o in outputs])


def _pair_tokens(pairs: list[tuple[int, int]], doc_tokens: list[int], query_tokens,
                 key=lambda qi: qi) -> list[int]:
    """Per pair: its document's tokens, plus its query's on the query's first pair."""
    seen = set()
    out = []
    for (qi, _), n in zip(pairs, doc_tokens):
        first = key(qi) not in seen
        seen.add(key(qi))
        out.append(int(n) + (int(query_tokens(qi)) if first else 0))
    return out


def _hashable(item):
    return item if isinstance(item, str) else tuple(item)


def _as_text(item) -> str | None:
    return item if isinstance(item, str) else None
