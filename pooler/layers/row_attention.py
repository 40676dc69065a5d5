"""Attention for one query row per sequence: the last encoder layer of a step whose pooling
reads a single row of each sequence ([CLS], <s> or the last token).

Such a step needs the last layer's output on those rows alone (the pooled-rows route,
`ModelInputs.output_rows`): keys and values still come from every token, but the query, the
attention, the output projection, the residual, the norms and the MLP run on one row per
sequence. The attention here scores each sequence's keys against its one query row: [heads,
L] scores instead of [L, L]; a few sequences one at a time (batched matmuls over the heads),
many at once over the packed tokens (each token's key against its own sequence's query, a
segment softmax, the values summed by segment: a handful of ops whatever the count). Grouped-query heads and unattended key
suffixes (ColBERT query expansion) are respected. Computed in fp32 whatever the inputs' dtype.
"""
from __future__ import annotations

import torch

# Sequences of at least this many tokens on average run one at a time (_per_sequence: ~40 us
# of matmuls each, whatever the length); shorter ones take the segment ops over all packed
# tokens at once (a handful of ops, ~1.5 us per token). 12 heads x 64, 2 threads, Xeon
# (Sapphire Rapids) VM, loop vs segment: 1 x 4096 0.8 vs 18 ms, 8 x 512 1.0 vs 6.5, 16 x 128
# 0.9 vs 1.4, 32 x 64 1.6 vs 1.4, 64 x 16 2.6 vs 0.8.
_LOOP_MIN_MEAN_LEN = 96


def sequence_ids(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    """[num_tokens] index of the sequence each packed token belongs to."""
    return torch.repeat_interleave(torch.arange(len(seq_lens), device=device),
                                   torch.tensor(seq_lens, device=device))


def attention_for_rows(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim] the query row of each sequence
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] every packed token's key
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    seq_lens: list[int],
    scale: float,
    num_unattended: list[int] | None = None,  # [num_seqs] trailing keys nobody attends to
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] in q's dtype
    num_seqs, num_heads, head_dim = q.shape
    num_tokens, num_kv_heads = k.shape[0], k.shape[1]
    if num_seqs != len(seq_lens) or num_tokens != sum(seq_lens):
        raise ValueError(f"attention_for_rows: {num_seqs} query rows and {num_tokens} keys for "
                         f"{len(seq_lens)} sequences of {sum(seq_lens)} tokens; one query row "
                         "per sequence is required.")
    group = num_heads // num_kv_heads
    if num_tokens >= _LOOP_MIN_MEAN_LEN * num_seqs:
        return _per_sequence(q, k, v, seq_lens, scale, num_unattended)
    seq = sequence_ids(seq_lens, q.device)  # [num_tokens]
    # [num_tokens, kv_heads, group, head_dim]: each token's own sequence's query
    q_per_token = q.float().view(num_seqs, num_kv_heads, group, head_dim).index_select(0, seq)
    scores = torch.einsum("tkgd,tkd->tkg", q_per_token, k.float()).mul_(scale)
    if num_unattended is not None and any(num_unattended):
        ends = torch.tensor([n - u for n, u in zip(seq_lens, num_unattended)], device=q.device)
        starts = torch.tensor([0] + seq_lens[:-1], device=q.device).cumsum(0)
        position = torch.arange(num_tokens, device=q.device) - starts.index_select(0, seq)
        scores.masked_fill_((position >= ends.index_select(0, seq))[:, None, None],
                            float("-inf"))
    # segment softmax over each sequence's keys: [num_seqs, kv_heads, group] max and sum
    index = seq[:, None, None].expand_as(scores)
    peak = torch.full((num_seqs, num_kv_heads, group), float("-inf"), device=q.device)
    peak.scatter_reduce_(0, index, scores, reduce="amax")
    weights = scores.sub_(peak.index_select(0, seq)).exp_()  # [num_tokens, kv_heads, group]
    total = torch.zeros_like(peak).index_add_(0, seq, weights)
    # sum of weight * value per sequence: [num_seqs, kv_heads, group, head_dim]
    out = torch.zeros(num_seqs, num_kv_heads, group, head_dim, device=q.device)
    out.index_add_(0, seq, weights[..., None] * v.float()[:, :, None, :])
    out.div_(total[..., None])
    return out.view(num_seqs, num_heads, head_dim).to(q.dtype)


def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                  scale: float, num_unattended: list[int] | None) -> torch.Tensor:
    """The same attention one sequence at a time, as batched matmuls over the kv heads: fewer
    passes over a long document's keys and values than the segment ops (one 4,096-token
    GTE-base document: their scatter-add of weighted values alone took ~50 ms)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=q.dtype, device=q.device)
    start = 0
    for i, length in enumerate(seq_lens):
        keys = length - (num_unattended[i] if num_unattended else 0)
        ks = k[start:start + keys].float().transpose(0, 1)  # [kv_heads, keys, head_dim]
        vs = v[start:start + keys].float().transpose(0, 1)
        qs = q[i].float().view(num_kv_heads, group, head_dim)  # [kv_heads, group, head_dim]
        weights = torch.matmul(qs, ks.transpose(1, 2)).mul_(scale).softmax(-1)  # [kv, g, keys]
        out[i] = torch.matmul(weights, vs).view(num_heads, head_dim)
        start += length
    return out


def scatter_rows(full: torch.Tensor, rows: torch.Tensor, compact: torch.Tensor) -> torch.Tensor:
    """full: [num_tokens, hidden] with compact [num_rows, hidden] written at `rows`, in place;
    the other rows keep what they held (the pooling never reads them)."""
    return full.index_copy_(0, rows, compact.to(full.dtype))
