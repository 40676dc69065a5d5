"""Inputs longer than the model's maximum length: chunked processing and late chunking.

Chunked processing (`Engine.embed(..., long_input="chunk")`): an over-long input is split into
windows of at most the model's max length (each with the tokenizer's own special tokens around
its slice of the text's tokens, consecutive windows sharing `overlap` tokens), every window runs
as its own sequence in the engine's packed batches, and the embedding is the token-weighted mean
of the windows' pooled vectors, normalized (and Matryoshka-truncated) at the end, the way vLLM's
chunked processing aggregates.

Late chunking (`Engine.embed_chunks`): the whole document is encoded once, in overlapping
windows when it is longer than the max length, and each chunk's vector is the mean of the
document's token vectors that fall inside the chunk's character span, so every chunk vector
carries the context of the whole document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pooler.engine.input_processor import ProcessedInput

LONG_INPUT_MODES = ("truncate", "chunk")
# How score/rerank combine a long document's window scores (pooler/engine/tasks/long_scoring.py):
# "max" is MaxP (the best passage decides, Dai & Callan 2019), "mean" averages every window.
CHUNK_AGGREGATES = ("max", "mean")


@dataclass
class Windows:
    """The windows of one input: `inputs[i]` covers content tokens `spans[i]` (half-open,
    indices into the input's content tokens, i.e. without its leading/trailing specials)."""
    inputs: list[ProcessedInput]
    spans: list[tuple[int, int]]
    num_prefix: int  # special tokens before the content (e.g. [CLS]) in every window


def check_overlap(overlap: int, max_length: int, num_special: int,
                  option: str = "chunk_overlap") -> int:
    """`option`: the caller's name of the overlap (embed's chunk_overlap, embed_chunks'
    window_overlap), so the error names what the user passed."""
    room = max_length - num_special
    if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
        raise ValueError(f"{option} must be a non-negative integer, got {overlap!r}.")
    if overlap >= room:
        raise ValueError(f"{option}={overlap} must be smaller than the tokens a window "
                         f"holds ({room} = max length {max_length} - {num_special} special "
                         "tokens).")
    return overlap


def split_into_windows(item: ProcessedInput, max_length: int, overlap: int,
                       option: str = "chunk_overlap") -> Windows:
    """Cut one tokenized input into windows of at most `max_length` tokens (`option`: the
    overlap's name in errors)."""
    ids = item.prompt_token_ids
    special = item.special_tokens_mask or [0] * len(ids)
    prefix = 0
    while prefix < len(ids) and special[prefix]:
        prefix += 1
    suffix = 0
    while suffix < len(ids) - prefix and special[len(ids) - 1 - suffix]:
        suffix += 1
    content = ids[prefix:len(ids) - suffix]
    room = max_length - prefix - suffix
    check_overlap(overlap, max_length, prefix + suffix, option)
    types = item.token_type_ids
    spans, inputs = [], []
    start = 0
    while True:
        end = min(start + room, len(content))
        window_ids = ids[:prefix] + content[start:end] + ids[len(ids) - suffix:]
        window_types = None if types is None else \
            types[:prefix] + types[prefix + start:prefix + end] + types[len(ids) - suffix:]
        inputs.append(ProcessedInput(
            prompt_token_ids=window_ids, token_type_ids=window_types,
            special_tokens_mask=[1] * prefix + [0] * (end - start) + [1] * suffix,
            num_prompt_tokens=0, text=item.text))
        spans.append((start, end))
        if end >= len(content):
            return Windows(inputs, spans, prefix)
        start = end - overlap


def cut_content(item: ProcessedInput, max_tokens: int) -> ProcessedInput:
    """The input cut to `max_tokens` tokens, its leading and trailing special tokens kept
    (vLLM's max_tokens_per_doc on a document encoded alone)."""
    ids = item.prompt_token_ids
    if len(ids) <= max_tokens:
        return item
    special = item.special_tokens_mask or [0] * len(ids)
    suffix = 0
    while suffix < len(ids) and special[len(ids) - 1 - suffix]:
        suffix += 1
    keep = list(range(max(max_tokens - suffix, 0))) + list(range(len(ids) - suffix, len(ids)))

    def pick(values):
        return None if values is None else [values[i] for i in keep]
    return ProcessedInput(prompt_token_ids=pick(ids), token_type_ids=pick(item.token_type_ids),
                          special_tokens_mask=pick(special), text=item.text)


def weighted_mean(vectors: list[np.ndarray], weights: list[int]) -> np.ndarray:
    """Token-weighted mean of window vectors: [num_windows, dim] -> [dim]."""
    stacked = np.stack(vectors).astype(np.float64)  # [num_windows, dim]
    w = np.asarray(weights, dtype=np.float64)[:, None]
    return (stacked * w).sum(0) / w.sum()


def check_long_input(long_input, chunk_aggregate=None) -> None:
    """The options every long-input call takes, checked before any work."""
    if long_input not in LONG_INPUT_MODES:
        raise ValueError(f"long_input must be one of {list(LONG_INPUT_MODES)}, "
                         f"got {long_input!r}.")
    if chunk_aggregate is not None and chunk_aggregate not in CHUNK_AGGREGATES:
        raise ValueError(f"chunk_aggregate must be one of {list(CHUNK_AGGREGATES)}, "
                         f"got {chunk_aggregate!r}.")


def scoring_overlap(overlap: int | None, room: int) -> int:
    """score/rerank's chunk_overlap for windows of `room` document tokens: a quarter of a
    window when unset, at most half of one, so a document costs at most about twice its
    tokens however the overlap is set."""
    if overlap is None:
        return room // 4
    if overlap > room // 2:
        raise ValueError(f"chunk_overlap={overlap} must be at most half the document tokens a "
                         f"window holds ({room // 2} of {room}).")
    return overlap


def aggregate(scores: list[float], how: str) -> float:
    """A document's window scores -> its score: the best window ("max") or their mean."""
    return float(max(scores)) if how == "max" else float(np.mean(np.asarray(scores, np.float64)))


def finalize(vector: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Matryoshka truncation, then L2 normalization: [dim] -> [dimensions or dim] float32."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector.astype(np.float32)


# ---- late chunking --------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the sentences of `text` (split after . ! ? and whitespace), with
    surrounding whitespace left out."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def check_chunks(chunks, text: str) -> list[tuple[int, int]]:
    out = []
    for i, chunk in enumerate(chunks):
        if not (isinstance(chunk, (list, tuple)) and len(chunk) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in chunk)):
            raise ValueError(f"chunks[{i}] must be a (start, end) pair of character offsets, "
                             f"got {chunk!r}.")
        start, end = chunk
        if not 0 <= start < end <= len(text):
            raise ValueError(f"chunks[{i}]=({start}, {end}) is not a non-empty span inside the "
                             f"document (0 <= start < end <= {len(text)}).")
        out.append((int(start), int(end)))
    if not out:
        raise ValueError("chunks is empty: give at least one (start, end) span.")
    return out


def tokens_in_span(offsets: list[tuple[int, int]], special: list[int], start: int,
                   end: int) -> list[int]:
    """Indices of the non-special tokens whose characters overlap [start, end)."""
    return [i for i, ((s, e), sp) in enumerate(zip(offsets, special))
            if not sp and s < end and e > start]


def assign_tokens(num_content: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """For each content token, (window, position in that window's content): the window in
    which the token sits farthest from an edge, i.e. with the most context on both sides."""
    best: list[tuple[int, int]] = [(-1, -1)] * num_content
    margin = [-1] * num_content
    for w, (s, e) in enumerate(spans):
        for t in range(s, e):
            m = min(t - s, e - 1 - t)
            if m > margin[t]:
                margin[t], best[t] = m, (w, t - s)
    return best
