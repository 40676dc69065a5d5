"""Late interaction (ColBERT): query and document token vectors (`encode_queries`,
`encode_documents`, inputs from pooler/engine/colbert_inputs.py), and MaxSim scores computed
in the runner through its query cache (two_stage.py, which BGE-M3's and page retrieval's
scores take too). Page retrieval models' calls go to page_retrieval.py.
"""
from __future__ import annotations

from typing import Any, Sequence

from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.engine.input_processor import normalize_inputs
from pooler.engine.lora import with_lora
from pooler.engine.tasks import page_retrieval
from pooler.engine.tasks.common import TaskEngine
from pooler.engine.tasks.pairs import ScoreRequest
from pooler.engine.tasks.two_stage import two_stage
from pooler.outputs import TokenEmbeddingOutput, as_numpy
from pooler.params import LateInteractionParams, PoolingParams


@with_lora
def encode_queries(engine: TaskEngine, inputs: str | Sequence, *,
                   use_tqdm: bool | None = None,
                   priority: int = 0) -> list[TokenEmbeddingOutput]:
    """ColBERT query token vectors, as PyLate's encode(is_query=True): marker, [MASK]
    expansion up to the query length, L2-normalized. Page retrieval models (ColModernVBert):
    the query prompt with its augmentation tokens, as the model's processor.process_queries."""
    if page_retrieval.is_page_model(engine):
        return page_retrieval.encode(engine, inputs, "query", use_tqdm=use_tqdm,
                                     priority=priority)
    return _colbert_encode(engine, inputs, "query", use_tqdm, priority)


@with_lora
def encode_documents(engine: TaskEngine, inputs: Any, *, pool_factor: float | None = None,
                     use_tqdm: bool | None = None,
                     priority: int = 0) -> list[TokenEmbeddingOutput]:
    """ColBERT document token vectors, as PyLate's encode(is_query=False): marker,
    truncated to the document length, punctuation dropped, L2-normalized. Page retrieval
    models (ColModernVBert): page images (PIL image, pathlib.Path, bytes, data URL, {"image": ...})
    or texts, each a multi-vector of every token (image tokens included).
    pool_factor: hierarchical token pooling, about 1/pool_factor of each document's vectors
    kept (the first token kept as is; PyLate's pool_factor)."""
    if page_retrieval.is_page_model(engine):
        return page_retrieval.encode(engine, inputs, "document", pool_factor=pool_factor,
                                     use_tqdm=use_tqdm, priority=priority, field="documents")
    return _colbert_encode(engine, inputs, "document", use_tqdm, priority,
                           page_retrieval.pool_factor_extra(engine, pool_factor))


def colbert_input_builder(engine: TaskEngine):
    """Texts -> ProcessedInput for this engine's ColBERT model (Engine caches it:
    `colbert_inputs`)."""
    from pooler.engine.colbert_inputs import ColBERTInputBuilder

    if engine.model_config.colbert is None:
        raise ValueError(f"{engine.model_config.model} is not a ColBERT model (no PyLate "
                         "config, Stanford artifact.metadata or colbert_mode).")
    return ColBERTInputBuilder(engine.model_config.colbert, engine.tokenizer,
                               engine.model_config.max_model_len)


def _colbert_encode(engine: TaskEngine, inputs, role: str, use_tqdm, priority,
                    extra: dict | None = None):
    processed = engine.colbert_inputs.build(normalize_inputs(inputs), role)
    params = [engine.verify_params(PoolingParams(task="token_embed", extra={
        ROLE_KEY: role, UNATTENDED_KEY: int(p.extra.get(UNATTENDED_KEY, 0)), **(extra or {})}))
        for p in processed]
    results = engine.run_processed(processed, params, priority, use_tqdm)
    return [TokenEmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
            for r in results]


def late_interaction_scores(engine: TaskEngine, request: ScoreRequest, use_tqdm, priority,
                            cancel, pool_factor: float | None = None
                            ) -> tuple[list[float], list[int]]:
    """Each pair's MaxSim score (the runner computes it against the cached query);
    pool_factor pools each document's vectors first."""
    builder = engine.colbert_inputs
    doc_extra = page_retrieval.pool_factor_extra(engine, pool_factor)
    results, tokens = two_stage(engine, request, builder.build,
                                lambda item, role, li: _colbert_params(
                                    engine, item, role, li,
                                    doc_extra if role == "document" else None),
                                use_tqdm, priority, cancel)
    return [float(r.data) for r in results], tokens


def _colbert_params(engine: TaskEngine, item, role: str, li: LateInteractionParams,
                    more: dict | None = None) -> PoolingParams:
    extra = {ROLE_KEY: role, UNATTENDED_KEY: int(item.extra.get(UNATTENDED_KEY, 0)),
             **(more or {})}
    return engine.verify_params(PoolingParams(task="token_embed", late_interaction=li,
                                              extra=extra))
