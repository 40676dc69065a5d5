"""Attention with a per-sequence additive score bias, over packed sequences.

For models whose attention scores carry a term that depends on both the tokens and their
relative positions (DeBERTa's disentangled attention), so it cannot be one shared mask: the
caller's `bias_fn` builds the [count, heads, L, L] bias for each run of equal-length sequences
from their queries and keys. Nothing is padded: sequences of one length run together, in chunks
whose scores fit in cache, exactly like pooler/layers/attention.py.

CPU fp32: explicit matmul + softmax (bitwise the reference's order of operations). Elsewhere:
SDPA with the bias as a float mask (the memory-efficient kernel takes one on CUDA).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

# Bytes of scores (and bias) one chunk may hold.
_SCORE_BYTES = 4 * 2**20

# (queries [n, heads, L, d], keys [n, heads, L, d]) -> additive bias [n, heads, L, L]: a fresh
# tensor, which the attention overwrites with the scores.
BiasFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def packed_biased_attention(
    q: torch.Tensor,  # [num_tokens, heads, head_dim]
    k: torch.Tensor,  # [num_tokens, heads, head_dim]
    v: torch.Tensor,  # [num_tokens, heads, head_dim]
    seq_lens: list[int],
    bias_fn: BiasFn,
    scale: float,
    num_unattended: list[int] | None = None,  # [num_seqs] trailing keys nobody attends to
    widest_bias: int = 0,  # widest intermediate bias_fn builds per query row (chunk sizing)
) -> torch.Tensor:  # [num_tokens, heads, head_dim]
    heads, head_dim = q.shape[1], q.shape[2]
    out = torch.empty_like(q)
    math_path = q.device.type == "cpu" and q.dtype == torch.float32
    start, i, n = 0, 0, len(seq_lens)
    while i < n:
        length = seq_lens[i]
        unattended = num_unattended[i] if num_unattended else 0
        if unattended >= length:
            raise ValueError(f"num_unattended must leave at least one attended token: got "
                             f"{unattended} for a sequence of {length}.")
        j = i + 1
        while j < n and seq_lens[j] == length and (
                (num_unattended[j] if num_unattended else 0) == unattended):
            j += 1
        count = j - i
        row_bytes = heads * length * (2 * length + widest_bias) * q.element_size()
        per_chunk = max(1, _SCORE_BYTES // row_bytes)
        for a in range(0, count, per_chunk):
            b = min(count, a + per_chunk)
            rows = slice(start + a * length, start + b * length)
            # [b - a, heads, L, head_dim]
            qs = q[rows].view(b - a, length, heads, head_dim).transpose(1, 2)
            ks = k[rows].view(b - a, length, heads, head_dim).transpose(1, 2)
            vs = v[rows].view(b - a, length, heads, head_dim).transpose(1, 2)
            bias = bias_fn(qs, ks)  # [b - a, heads, L, L], ours to overwrite
            if unattended:
                bias = bias.masked_fill(_trailing_keys(length, unattended, q.device),
                                        torch.finfo(bias.dtype).min)
            if math_path:
                # scale * q.k + bias in one pass over the scores
                scores = bias.add_(torch.matmul(qs, ks.transpose(-1, -2)), alpha=scale)
                o = torch.matmul(scores.softmax(-1), vs)  # [b - a, heads, L, head_dim]
            else:
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias.to(q.dtype),
                                                   scale=scale)
            out[rows].view(b - a, length, heads, head_dim).copy_(o.transpose(1, 2))
        start += count * length
        i = j
    return out


def _trailing_keys(length: int, unattended: int, device: torch.device) -> torch.Tensor:
    """[L] bool, True for the last `unattended` keys (broadcast over queries)."""
    return torch.arange(length, device=device) >= length - unattended
