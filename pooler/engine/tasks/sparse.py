"""SPLADE sparse embeddings (`embed_sparse`): a masked-LM model's vocabulary-sized vector per
input, as {token_id: weight}; an inference-free model's queries use static token weights."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.engine.lora import with_lora
from pooler.engine.tasks.common import TaskEngine, encode_inputs
from pooler.outputs import SparseEmbeddingOutput, as_numpy
from pooler.params import PoolingParams
from pooler.tokenizer import TextTokenizer


@with_lora
def embed_sparse(engine: TaskEngine, inputs: str | Sequence, *, top_k: int | None = None,
                 threshold: float | None = None, pooling: str | None = None,
                 skip_special_tokens: bool = False, query: bool = False,
                 truncate: bool = True, truncate_prompt_tokens: int | None = None,
                 truncation_direction: str = "right", prompt: str | None = None,
                 prompt_name: str | None = None, use_tqdm: bool | None = None,
                 priority: int = 0) -> list[SparseEmbeddingOutput]:
    """SPLADE sparse embeddings of a *ForMaskedLM model, as {token_id: weight} per input.

    top_k / threshold: keep the k largest weights / weights above the threshold.
    pooling: "max" (default unless the model declares "sum") or "sum" over tokens.
    skip_special_tokens: leave [CLS]/[SEP] out of the pooling (included by default, as
    sentence-transformers and the original SPLADE do).
    query: encode as a query; an inference-free model (a sentence-transformers Router with a
    SparseStaticEmbedding query route) then uses its static token weights, no forward pass.
    """
    from pooler.pooling.sparse import SparseOptions, prune

    options = SparseOptions(pooling=pooling, top_k=top_k, threshold=threshold).validated()
    if engine.model_config.head != "mlm":
        raise ValueError(
            f"embed_sparse needs a masked-LM model (*ForMaskedLM, e.g. a SPLADE model such "
            f"as naver/splade-cocondenser-ensembledistil); this model "
            f"({engine.model_config.architecture}) has no vocabulary head. Load such a "
            "model: Engine('path/or/hub-name') in Python, `pooler sparse --model PATH` on "
            "the command line, or serve it with `pooler serve PATH` (/embed_sparse).")
    static = engine._static_query_encoder if query else None
    if static is not None:
        texts = normalize_inputs(inputs)
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("inference-free queries must be texts, not token ids.")
        vectors = static.encode(texts)
        return [sparse_output(prune(v, top_k, threshold), n, f"static-{i}", static.tokenizer)
                for i, (v, n) in enumerate(vectors)]
    params = PoolingParams(task="embed", skip_special_tokens=skip_special_tokens,
                           extra={"sparse": options.as_extra()})
    results = encode_inputs(engine, inputs, params, TruncationOptions(
        truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
        use_tqdm, priority)
    return [sparse_output(r.data, r.num_tokens, r.request_id, engine.tokenizer)
            for r in results]


def static_query_encoder(engine: TaskEngine):
    """An inference-free model's static query weights, or None (Engine caches it:
    `_static_query_encoder`)."""
    from pooler.pooling.sparse_static import StaticSparseEncoder
    from pooler.sparse_layout import read_splade_layout

    path = read_splade_layout(engine.model_config.root_path).query_static_path
    return StaticSparseEncoder(path) if path is not None else None


def sparse_output(vector, num_tokens: int, request_id: str,
                  tokenizer: TextTokenizer) -> SparseEmbeddingOutput:
    dense = as_numpy(vector)                          # [vocab]
    indices = np.flatnonzero(dense)
    order = np.lexsort((indices, -dense[indices]))     # weight descending, then id
    indices = indices[order].astype(np.int64)
    return SparseEmbeddingOutput(
        indices=indices, values=dense[indices],
        tokens=[tokenizer.id_to_token(int(i)) or "" for i in indices],
        num_tokens=num_tokens, request_id=request_id)
