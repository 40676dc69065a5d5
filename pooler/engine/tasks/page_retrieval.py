"""Page retrieval (ColModernVBert): late interaction over page images. Queries and documents
become multi-vectors (`encode_queries`, `encode_documents`, `token_embed`), and `score` /
`rerank` give each (query, page) pair its MaxSim score, computed in the runner through the
late-interaction query cache (two_stage.py: each distinct query cached once, each
page scored against it). Inputs: pooler/engine/page_inputs.py; documents are page images
(PIL image, pathlib.Path, bytes, data URL, {"image": ...}) or texts.

The Engine's front doors (late_interaction.py, embedding.py, scoring.py, common.py) hand
page-retrieval models' calls here, so every caller (offline API, CLI, HTTP dialects) passes
image items wherever documents go, with nothing model-specific of its own.

`pool_factor` (documents only): hierarchical token pooling of each document's multi-vector in
the runner (pooler/pooling/token_pooling.py), before MaxSim where a call scores.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from pooler.engine.tasks.common import TaskEngine
from pooler.engine.tasks.pairs import ScoreRequest, pairing
from pooler.engine.tasks.two_stage import two_stage
from pooler.outputs import ScoreOutput, TokenEmbeddingOutput, as_numpy
from pooler.params import LateInteractionParams, PoolingParams
from pooler.pooling.token_pooling import POOL_FACTOR_KEY, check_pool_factor


def is_page_model(engine: TaskEngine) -> bool:
    return getattr(engine, "pages", None) is not None


def pool_factor_extra(engine: TaskEngine, pool_factor: Any) -> dict:
    """PoolingParams.extra for a call's pool_factor (validated; {} when None)."""
    if pool_factor is None:
        return {}
    factor = check_pool_factor(pool_factor)
    config = engine.model_config
    if not is_page_model(engine) and (config.colbert is None
                                      or getattr(config, "bge_m3", None) is not None):
        raise ValueError("pool_factor pools documents' multi-vectors: it applies to ColBERT "
                         f"and page retrieval models only, not {config.architecture}.")
    return {POOL_FACTOR_KEY: factor}


def items_of(inputs: Any, field: str) -> list:
    """One item, or a list of them (texts and images mixed)."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if not items:
        raise ValueError(f"{field} is empty: pass at least one text or page image.")
    return items


def encode(engine: TaskEngine, inputs: Any, role: str, *, normalize: bool | None = None,
           pool_factor: Any = None, use_tqdm: bool | None = None, priority: int = 0,
           field: str | None = None) -> list[TokenEmbeddingOutput]:
    """Multi-vectors of queries (role "query": the query prompt) or documents (page images
    or texts)."""
    params = encode_params(engine, role, normalize=normalize, pool_factor=pool_factor)
    results = run(engine, inputs, role, params, use_tqdm, priority, field)
    return [TokenEmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
            for r in results]


def encode_params(engine: TaskEngine, role: str, normalize: bool | None = None,
                  pool_factor: Any = None, base: PoolingParams | None = None) -> PoolingParams:
    if role == "query" and pool_factor is not None:
        raise ValueError("pool_factor applies to documents (pages), not to queries.")
    params = (base or PoolingParams(task="token_embed")).clone()
    if normalize is not None:
        params.normalize = normalize
    params.extra = {**params.extra, **pool_factor_extra(engine, pool_factor)}
    return engine.verify_params(params)


def run(engine: TaskEngine, inputs: Any, role: str, params: PoolingParams, use_tqdm, priority,
        field: str | None = None, cancel: threading.Event | None = None) -> list:
    items = items_of(inputs, field or ("queries" if role == "query" else "inputs"))
    processed = engine.pages.build(items, role, field or (
        "queries" if role == "query" else "inputs"))
    return engine.run_processed(processed, [params] * len(processed), priority, use_tqdm,
                                cancel=cancel)


def scores(engine: TaskEngine, queries: str | Sequence, documents: Any, *,
           pool_factor: Any = None, use_tqdm: bool | None = None, priority: int = 0,
           cancel: threading.Event | None = None) -> list[ScoreOutput]:
    """MaxSim of (query, document) pairs: 1 query x N documents, or N x N pairwise."""
    qs = [queries] if isinstance(queries, str) else items_of(queries, "queries")
    ds = items_of(documents, "documents")
    pairs = pairing(len(qs), len(ds))
    for i, q in enumerate(qs):
        if not isinstance(q, str):
            raise ValueError(f"queries[{i}] must be a text: "
                             f"{engine.model_config.architecture} scores text queries against "
                             "page images or texts.")
    doc_extra = pool_factor_extra(engine, pool_factor)

    def make_params(item, role: str, li: LateInteractionParams) -> PoolingParams:
        extra = doc_extra if role == "document" else {}
        return engine.verify_params(PoolingParams(task="token_embed", late_interaction=li,
                                                  extra=dict(extra)))

    results, tokens = two_stage(engine, ScoreRequest(qs, ds, pairs), engine.pages.build,
                                make_params, use_tqdm, priority, cancel)
    return [ScoreOutput(float(r.data), qi, di, n)
            for r, n, (qi, di) in zip(results, tokens, pairs)]
