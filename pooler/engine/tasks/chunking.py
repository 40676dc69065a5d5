"""Inputs longer than the model's max length (the windowing itself: pooler/engine/long_inputs.py):
`embed(..., long_input="chunk")` averages the windows' vectors; late chunking (`embed_chunks`)
pools each chunk of a document from the whole document's token states."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pooler.engine import long_inputs
from pooler.engine.input_processor import TruncationOptions, normalize_inputs
from pooler.engine.lora import with_lora, with_task_adapter
from pooler.engine.tasks.common import TaskEngine
from pooler.outputs import ChunkEmbeddingOutput, EmbeddingOutput, as_numpy
from pooler.params import PoolingParams


def embed_chunked(engine: TaskEngine, inputs, params: PoolingParams,
                  truncation: TruncationOptions, prompt: str | None, prompt_name: str | None,
                  overlap: int, use_tqdm: bool | None, priority: int) -> list[EmbeddingOutput]:
    """Embed over-long inputs window by window; every window of every input runs in the
    same engine batches. Windows are pooled raw (no normalization, full size), averaged
    with their token counts as weights, then truncated and normalized as asked."""
    final = engine.verify_params(params)
    if final.extra.get("sparse"):
        raise ValueError("long_input='chunk' applies to dense embeddings, not sparse ones.")
    raw = final.clone()
    raw.normalize, raw.dimensions = False, None
    items = normalize_inputs(inputs)
    prompt_text = engine.processor.resolve_prompt(prompt, prompt_name)
    processed = engine.processor.process(items, truncation=truncation, prompt=prompt_text,
                                         whole=True)
    limit = engine.processor.max_length_for(truncation)
    groups = [long_inputs.split_into_windows(p, limit, overlap)
              if len(p.prompt_token_ids) > limit else None for p in processed]
    flat = [w for p, g in zip(processed, groups) for w in (g.inputs if g else [p])]
    results = iter(engine.run_processed(flat, [raw] * len(flat), priority, use_tqdm))
    out = []
    for p, group in zip(processed, groups):
        if group is None:
            r = next(results)
            vector, tokens = as_numpy(r.data).astype(np.float64), r.num_tokens
        else:
            window_results = [next(results) for _ in group.inputs]
            vector = long_inputs.weighted_mean([as_numpy(r.data) for r in window_results],
                                               [e - s for s, e in group.spans])
            tokens = sum(r.num_tokens for r in window_results)
        out.append(EmbeddingOutput(
            long_inputs.finalize(vector, final.dimensions, final.normalize), tokens))
    return out


@with_task_adapter
@with_lora
def embed_chunks(engine: TaskEngine, document: str,
                 chunks: Sequence[tuple[int, int]] | None = None, *,
                 chunker: str = "sentences", normalize: bool | None = None,
                 dimensions: int | None = None, window_overlap: int | None = None,
                 use_tqdm: bool | None = None,
                 priority: int = 0) -> list[ChunkEmbeddingOutput]:
    """Late chunking: encode the whole document once (in windows overlapping by
    `window_overlap` tokens, default a quarter of the max length, when it is longer than
    the max length) and pool each chunk from the document's token states: the mean of the
    token vectors inside the chunk's character span, then Matryoshka truncation and
    normalization as for embed. `chunks`: (start, end) character spans; without them the
    document is cut into sentences (chunker="sentences"); a sentence with no token (only
    characters the tokenizer drops, e.g. control characters) has nothing to pool and is
    left out, so a document without any token has no chunks (an empty list)."""
    if not isinstance(document, str) or not document.strip():
        raise ValueError("document must be a non-empty string.")
    if chunks is None:
        if chunker != "sentences":
            raise ValueError(f"chunker must be 'sentences' (or pass chunks), got "
                             f"{chunker!r}.")
        spans = long_inputs.sentence_spans(document)
    else:
        spans = long_inputs.check_chunks(chunks, document)
    final = engine.verify_params(PoolingParams(task="embed", dimensions=dimensions,
                                               normalize=normalize))
    token_params = engine.verify_params(PoolingParams(task="token_embed", normalize=False))
    [item] = engine.processor.process([document], whole=True)
    special = item.special_tokens_mask or [0] * len(item.prompt_token_ids)
    content_index = [i for i, m in enumerate(special) if not m]
    offsets = [item.offsets[i] for i in content_index]
    # Each span's content tokens, before any model work.
    insides = [long_inputs.tokens_in_span(offsets, [0] * len(offsets), s, e)
               for s, e in spans]
    if chunks is None:  # the chunker's sentences: those without a token are left out
        spans, insides = [s for s, i in zip(spans, insides) if i], [i for i in insides if i]
        if not spans:
            return []
    for (start, end), inside in zip(spans, insides):
        if not inside:
            raise ValueError(f"chunk ({start}, {end}) covers no token of the document "
                             "(only whitespace or characters the tokenizer drops).")
    max_len = engine.model_config.max_model_len
    windows = long_inputs.split_into_windows(
        item, max_len, max_len // 4 if window_overlap is None else window_overlap,
        "window_overlap")
    results = engine.run_processed(windows.inputs, [token_params] * len(windows.inputs),
                                   priority, use_tqdm)
    # Token vectors of the document's content tokens, each from its best window.
    num_content = sum(1 for m in special if not m)
    vectors = [as_numpy(r.data) for r in results]  # [window_len, dim] each
    picks = long_inputs.assign_tokens(num_content, windows.spans)
    content = np.stack([vectors[w][windows.num_prefix + i] for w, i in picks])
    out = []
    for (start, end), inside in zip(spans, insides):
        vector = content[inside].astype(np.float64).mean(0)
        out.append(ChunkEmbeddingOutput(
            long_inputs.finalize(vector, final.dimensions, final.normalize), start, end,
            document[start:end], len(inside), len(item.prompt_token_ids)))
    return out
