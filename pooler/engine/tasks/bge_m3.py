"""BGE-M3: its dense vector, lexical weights and ColBERT vectors from one forward pass
(`embed_bge_m3`), and every score FlagEmbedding's compute_score gives (`score_bge_m3`, and
score / rerank on a BGE-M3 model). A query caches its three outputs in the runner's
late-interaction cache (late_interaction.two_stage); each document's output is its
(dense, sparse, colbert) scores, and the weighted combinations are made here."""
from __future__ import annotations

from typing import Sequence

from pooler.bge_m3_layout import BGE_M3_OUTPUTS, check_weights
from pooler.engine.input_processor import TruncationOptions
from pooler.engine.lora import with_lora
from pooler.engine.tasks.common import TaskEngine, encode_inputs
from pooler.engine.tasks.two_stage import two_stage
from pooler.engine.tasks.pairs import ScoreRequest, pair_inputs
from pooler.engine.tasks.sparse import sparse_output
from pooler.outputs import BGEM3Output, BGEM3Score, as_numpy
from pooler.params import PoolingParams


@with_lora
def embed_bge_m3(engine: TaskEngine, inputs: str | Sequence, *,
                 outputs: Sequence[str] = ("dense", "sparse", "colbert"),
                 truncate: bool = True, truncate_prompt_tokens: int | None = None,
                 use_tqdm: bool | None = None, priority: int = 0) -> list[BGEM3Output]:
    """BGE-M3's dense vector, lexical weights and ColBERT vectors, any of them, from one
    forward pass per input (FlagEmbedding's BGEM3FlagModel.encode with return_dense /
    return_sparse / return_colbert_vecs)."""
    require_bge_m3(engine)
    params = PoolingParams(task="embed", extra={"bge_m3": list(outputs)})
    results = encode_inputs(engine, inputs, params, TruncationOptions(
        truncate, truncate_prompt_tokens), None, None, use_tqdm, priority)
    out = []
    for r in results:
        data = r.data
        sparse = data.get("sparse")
        out.append(BGEM3Output(
            dense=as_numpy(data["dense"]) if "dense" in data else None,
            sparse=None if sparse is None else sparse_output(
                sparse, r.num_tokens, r.request_id, engine.tokenizer),
            colbert=as_numpy(data["colbert"]) if "colbert" in data else None,
            num_tokens=r.num_tokens, request_id=r.request_id))
    return out


@with_lora
def score_bge_m3(engine: TaskEngine, queries: str | Sequence, documents: str | Sequence, *,
                 weights: Sequence[float] | None = None, truncate: bool = True,
                 truncate_prompt_tokens: int | None = None, use_tqdm: bool | None = None,
                 priority: int = 0) -> list[BGEM3Score]:
    """Every score FlagEmbedding's compute_score gives for each (query, document) pair:
    dense, sparse, colbert, and the weighted "sparse+dense" and "colbert+sparse+dense"
    (weights for dense, sparse, colbert; default [1, 1, 1] as FlagEmbedding, the BGE-M3
    model card uses [0.4, 0.2, 0.4]). 1 query x N documents, or N x N pairwise."""
    require_bge_m3(engine)
    return bge_m3_scores(engine, pair_inputs(queries, documents),
                         TruncationOptions(truncate, truncate_prompt_tokens),
                         weights, use_tqdm, priority)


def require_bge_m3(engine: TaskEngine) -> None:
    if engine.model_config.bge_m3 is None:
        if engine.model_config.runner != "native":
            raise ValueError("BGE-M3's sparse and ColBERT heads run on the native runner; "
                             "drop runner='transformers'.")
        raise ValueError(f"{engine.model_config.model} is not a BGE-M3 model: its folder has "
                         "no colbert_linear.pt and sparse_linear.pt beside the checkpoint.")


def bge_m3_scores(engine: TaskEngine, request: ScoreRequest, truncation: TruncationOptions,
                  weights: Sequence[float] | None, use_tqdm=None, priority: int = 0,
                  cancel=None) -> list[BGEM3Score]:
    """Each pair's scores as FlagEmbedding's compute_score, through the late-interaction
    cache: every distinct query runs once (its dense vector, lexical weights and ColBERT
    vectors from one forward pass stay cached), every document runs once and the runner
    scores it against its query (pooler/worker/late_interaction.py: bge_m3_scores). The
    weighted (dense, sparse, colbert) combinations are made here."""
    w_dense, w_sparse, w_colbert = check_weights(weights)
    extra = {"bge_m3": list(BGE_M3_OUTPUTS)}
    results, tokens = two_stage(
        engine, request,
        lambda items, role: engine.processor.process(items, truncation=truncation),
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
