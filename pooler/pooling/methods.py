"""Which tokens a sequence-level pooler reads: CLS, mean, max or last token.

All methods work on the packed [num_tokens, hidden] tensor, with segment sums instead of
padding, and return [num_reqs, hidden].
"""
from __future__ import annotations

import torch

from pooler.pooling.metadata import PoolingMetadata

SEQUENCE_POOLING_MODES = ("cls", "mean", "max", "lasttoken")


def pool_sequences(mode: str, hidden: torch.Tensor, metadata: PoolingMetadata,
                   include_prompt: bool = True) -> torch.Tensor:
    """hidden: [num_tokens, hidden] -> [num_reqs, hidden]."""
    num_reqs = metadata.num_reqs
    if mode == "cls":
        return hidden[metadata.seq_starts]
    if mode == "lasttoken":
        return hidden[[s + n - 1 for s, n in zip(metadata.seq_starts, metadata.seq_lens)]]
    if (mode == "mean" and num_reqs == 1 and include_prompt
            and metadata.seq_lens[0] == hidden.shape[0]):
        # The batch is one sequence, pooled whole (a single query): a plain mean.
        return hidden.float().mean(0, keepdim=True).to(hidden.dtype)
    seg = metadata.segment_ids(hidden.shape[0], not include_prompt, hidden.device)
    if mode == "mean":
        # Sum in fp32 whatever the model dtype, then divide by the pooled token count.
        sums = torch.zeros(num_reqs + 1, hidden.shape[1], dtype=torch.float32,
                           device=hidden.device)
        sums.index_add_(0, seg, hidden.float())
        counts = torch.bincount(seg, minlength=num_reqs + 1)[:num_reqs].clamp(min=1)
        return (sums[:num_reqs] / counts[:, None].to(sums.dtype)).to(hidden.dtype)
    if mode == "max":
        out = torch.full((num_reqs + 1, hidden.shape[1]), float("-inf"), dtype=hidden.dtype,
                         device=hidden.device)
        out.scatter_reduce_(0, seg[:, None].expand_as(hidden), hidden, reduce="amax")
        return out[:num_reqs]
    raise ValueError(f"Unknown pooling mode {mode!r}; supported: {list(SEQUENCE_POOLING_MODES)}.")


def rows_read(mode: str, metadata: PoolingMetadata) -> list[int] | None:
    """The packed row each request's `mode` pooling reads (one per request, in request order),
    or None when it reads more than one row of a sequence (mean, max): what pool_sequences
    indexes for cls and lasttoken, whatever include_prompt says."""
    if mode == "cls":
        return list(metadata.seq_starts)
    if mode == "lasttoken":
        return [s + n - 1 for s, n in zip(metadata.seq_starts, metadata.seq_lens)]
    return None


def split_tokens(hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
    """All token states of each request: list of [seq_len, hidden] views."""
    return [hidden[s:e] for s, e in metadata.token_spans()]
