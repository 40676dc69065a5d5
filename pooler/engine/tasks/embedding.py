"""Dense embeddings: `embed` (optionally chunked for over-long inputs, optionally quantized),
`token_embed` (a vector per token), `encode` (any task's raw output) and the bi-encoder's
cosine scores for score / rerank."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pooler.engine import image_inputs, long_inputs
from pooler.engine.input_processor import TruncationOptions
from pooler.engine.lora import with_lora, with_task_adapter
from pooler.engine.tasks.chunking import embed_chunked
from pooler.engine.tasks import page_retrieval
from pooler.engine.tasks.common import TaskEngine, encode_inputs
from pooler.engine.tasks.pairs import ScoreRequest, pair_tokens
from pooler.outputs import EmbeddingOutput, PoolingOutput, TokenEmbeddingOutput, as_numpy
from pooler.params import PoolingParams
from pooler.quantize_output import check_precision, quantize_embeddings


@with_task_adapter
@with_lora
def embed(engine: TaskEngine, inputs: str | Sequence, *, dimensions: int | None = None,
          normalize: bool | None = None, use_activation: bool | None = None,
          truncate: bool = True, truncate_prompt_tokens: int | None = None,
          truncation_direction: str = "right", prompt: str | None = None,
          prompt_name: str | None = None, add_special_tokens: bool = True,
          use_tqdm: bool | None = None, priority: int = 0,
          long_input: str = "truncate", chunk_overlap: int = 0,
          precision: str = "float32", ranges=None,
          calibration_embeddings=None) -> list[EmbeddingOutput]:
    """use_activation: vLLM's name for normalize (False: the raw pooled vector).
    add_special_tokens=False: texts are tokenized without [CLS]/[SEP] and the like.
    long_input="chunk": an input longer than the model's max length is embedded in
    windows (sharing `chunk_overlap` tokens) whose vectors are averaged, weighted by their
    tokens (pooler/engine/long_inputs.py); the default truncates.
    precision: "float32", or "int8" / "uint8" (256 buckets per dimension between
    `ranges` [2, dim], else the min/max of `calibration_embeddings` [n, dim], else of this
    call's own embeddings) or "binary" / "ubinary" (bits packed 8 per byte), as
    sentence-transformers' quantize_embeddings."""
    check_precision(precision)
    params = PoolingParams(task="embed", dimensions=dimensions, normalize=normalize,
                           use_activation=use_activation)
    truncation = TruncationOptions(truncate, truncate_prompt_tokens, truncation_direction)
    if long_input not in long_inputs.LONG_INPUT_MODES:
        raise ValueError(f"long_input must be one of {list(long_inputs.LONG_INPUT_MODES)}, "
                         f"got {long_input!r}.")
    if image_inputs.handles(engine, inputs):  # images, or an image-text model's texts
        results = image_inputs.encode(engine, inputs, params, truncation, use_tqdm, priority,
                                      unsupported={"prompt": prompt, "prompt_name": prompt_name,
                                                   "long_input": long_input != "truncate"})
        outputs = [EmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
                   for r in results]
    elif long_input == "chunk":
        if not add_special_tokens:
            raise ValueError("long_input='chunk' puts the model's special tokens around "
                             "every window: it needs add_special_tokens=True.")
        outputs = embed_chunked(engine, inputs, params, truncation, prompt, prompt_name,
                                chunk_overlap, use_tqdm, priority)
    else:
        results = encode_inputs(engine, inputs, params, truncation, prompt, prompt_name,
                                use_tqdm, priority, add_special_tokens=add_special_tokens)
        outputs = [EmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
                   for r in results]
    if precision != "float32" and outputs:
        codes = quantize_embeddings(np.stack([o.embedding for o in outputs]), precision,
                                    ranges, calibration_embeddings)
        for output, code in zip(outputs, codes):
            output.embedding = code
    return outputs


@with_task_adapter
@with_lora
def token_embed(engine: TaskEngine, inputs: str | Sequence, *, normalize: bool | None = None,
                skip_special_tokens: bool = False, truncate: bool = True,
                truncate_prompt_tokens: int | None = None,
                truncation_direction: str = "right", prompt: str | None = None,
                prompt_name: str | None = None, use_tqdm: bool | None = None,
                priority: int = 0, pool_factor: float | None = None
                ) -> list[TokenEmbeddingOutput]:
    """A vector per token ([num_tokens, hidden] per input; skip_special_tokens leaves
    [CLS]/[SEP] and the like out). Page retrieval models (ColModernVBert) take page images
    (and texts) too. pool_factor: hierarchical token pooling of each output (about
    1/pool_factor of the vectors kept, the first as is)."""
    if page_retrieval.is_page_model(engine):
        if prompt is not None or prompt_name is not None or skip_special_tokens:
            raise ValueError("prompt, prompt_name and skip_special_tokens do not apply to "
                             f"{engine.model_config.architecture}: its processor's prompts "
                             "are applied as they are.")
        return page_retrieval.encode(engine, inputs, "document", normalize=normalize,
                                     pool_factor=pool_factor, use_tqdm=use_tqdm,
                                     priority=priority, field="inputs")
    params = PoolingParams(task="token_embed", normalize=normalize,
                           skip_special_tokens=skip_special_tokens,
                           extra=page_retrieval.pool_factor_extra(engine, pool_factor))
    results = encode_inputs(engine, inputs, params, TruncationOptions(
        truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
        use_tqdm, priority)
    return [TokenEmbeddingOutput(as_numpy(r.data), r.num_tokens, r.request_id)
            for r in results]


@with_lora
def encode(engine: TaskEngine, inputs: str | Sequence,
           pooling_params: PoolingParams | None = None, *, truncate: bool = True,
           truncate_prompt_tokens: int | None = None, truncation_direction: str = "right",
           prompt: str | None = None, prompt_name: str | None = None,
           add_special_tokens: bool = True, use_tqdm: bool | None = None,
           priority: int = 0) -> list[PoolingOutput]:
    """Run any task; `pooling_params.task` picks it (default: the model's task)."""
    params = pooling_params or PoolingParams()
    if page_retrieval.is_page_model(engine):  # page images or texts, as documents
        if prompt is not None or prompt_name is not None:
            raise ValueError("prompt and prompt_name do not apply to "
                             f"{engine.model_config.architecture}.")
        params = page_retrieval.encode_params(engine, "document", base=params)
        results = page_retrieval.run(engine, inputs, "document", params, use_tqdm, priority)
        return [PoolingOutput(as_numpy(r.data), r.num_tokens, r.extra["task"], r.request_id)
                for r in results]
    results = encode_inputs(engine, inputs, params, TruncationOptions(
        truncate, truncate_prompt_tokens, truncation_direction), prompt, prompt_name,
        use_tqdm, priority, add_special_tokens=add_special_tokens)
    return [PoolingOutput(as_numpy(r.data), r.num_tokens, r.extra["task"], r.request_id)
            for r in results]


def bi_encoder_scores(engine: TaskEngine, request: ScoreRequest, truncation, use_tqdm,
                      priority, cancel, max_tokens_per_doc: int | None = None):
    """Cosine similarity of each pair's embeddings; every distinct query and document is
    embedded once."""
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
    vectors = np.stack([as_numpy(r.data) for r in results])  # [queries + documents, dim]
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    q_row = {qi: n for n, qi in enumerate(used_q)}
    d_row = {dj: len(used_q) + n for n, dj in enumerate(used_d)}
    scores = [float(vectors[q_row[qi]] @ vectors[d_row[di]]) for qi, di in request.pairs]
    lengths = [len(p.prompt_token_ids) for p in processed]
    return scores, pair_tokens(request.pairs, [lengths[d_row[di]] for _, di in request.pairs],
                               lambda qi: lengths[q_row[qi]])
