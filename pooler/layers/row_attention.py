"""Attention for one query row per sequence: the last encoder layer of a step whose pooling
reads a single row of each sequence ([CLS], <s> or the last token).

Such a step needs the last layer's output on those rows alone (the pooled-rows route,
`ModelInputs.output_rows`): keys and values still come from every token, but the query, the
attention, the output projection, the residual, the norms and the MLP run on one row per
sequence. The attention here scores each sequence's keys against its one query row: [heads,
L] scores instead of [L, L], in a handful of ops whatever the step's sequence count: segment
ops over the packed tokens (each token's key against its own sequence's query, a segment
softmax, the values summed by segment), or two matmuls for a step of one sequence. Measured
(benchmarks/prune_last_layer.py --parts attention, 12 heads x 64, 2 threads, Xeon Sapphire
Rapids VM): the segment ops beat keys gathered into [num_seqs, longest] slots at every mix
but one document alone (8 x 512: 2.7 vs 4.8 ms; 1 x 4096: 2.6 vs 0.8 ms); a loop over the
sequences (4 small parallel ops each) ran fine on a quiet machine but made 8 x 512 tokens
0.68x slower than the full layer on the loaded VM, each small op waiting for a descheduled
thread. Grouped-query heads, unattended key suffixes (ColBERT query expansion) and, for
decoders, causal masks and sliding windows (from each row's position) are respected. Computed
in fp32 whatever the inputs' dtype.
"""
from __future__ import annotations

import torch


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
    *,
    query_positions: list[int] | None = None,  # [num_seqs] each row's index in its sequence
    causal: bool = False,  # a row sees the keys up to its own position (decoders)
    half_window: int | None = None,  # and those at most this far before it (sliding window)
    bias: torch.Tensor | None = None,  # [num_tokens, num_heads] added to the scaled scores
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] in q's dtype
    """Bidirectional attention needs no query_positions; causal or windowed attention does.
    Without causal, a half_window is symmetric: keys at most that far on either side (ModernBERT's
    local layers). `bias`: each key's additive score term against its sequence's query row
    (DeBERTa's relative-position terms), already scaled."""
    num_seqs, num_heads, head_dim = q.shape
    num_tokens, num_kv_heads = k.shape[0], k.shape[1]
    if num_seqs != len(seq_lens) or num_tokens != sum(seq_lens):
        raise ValueError(f"attention_for_rows: {num_seqs} query rows and {num_tokens} keys for "
                         f"{len(seq_lens)} sequences of {sum(seq_lens)} tokens; one query row "
                         "per sequence is required.")
    if (causal or half_window is not None) and query_positions is None:
        raise ValueError("attention_for_rows: causal or windowed attention needs "
                         "query_positions.")
    # [num_seqs] the attended keys of each sequence: [first, end) of its own positions
    ends = [n - (num_unattended[i] if num_unattended else 0) for i, n in enumerate(seq_lens)]
    firsts = [0] * num_seqs
    if query_positions is not None:
        if causal:
            ends = [min(e, p + 1) for e, p in zip(ends, query_positions)]
        elif half_window is not None:
            ends = [min(e, p + half_window + 1) for e, p in zip(ends, query_positions)]
        if half_window is not None:
            firsts = [max(0, p - half_window) for p in query_positions]
    if num_seqs == 1:  # a document alone: no segments to find
        return _one_sequence(q, k[firsts[0]:ends[0]], v[firsts[0]:ends[0]], scale,
                             None if bias is None else bias[firsts[0]:ends[0]])
    group = num_heads // num_kv_heads
    seq = sequence_ids(seq_lens, q.device)  # [num_tokens]
    # [num_tokens, kv_heads, group, head_dim]: each token's own sequence's query
    q_per_token = q.float().view(num_seqs, num_kv_heads, group, head_dim).index_select(0, seq)
    scores = torch.einsum("tkgd,tkd->tkg", q_per_token, k.float()).mul_(scale)
    if bias is not None:
        scores.add_(bias.float().view(num_tokens, num_kv_heads, group))
    if ends != list(seq_lens) or any(firsts):
        starts = torch.tensor([0] + seq_lens[:-1], device=q.device).cumsum(0)
        position = torch.arange(num_tokens, device=q.device) - starts.index_select(0, seq)
        ends_t, firsts_t = (torch.tensor(t, device=q.device).index_select(0, seq)
                            for t in (ends, firsts))
        scores.masked_fill_(((position >= ends_t) | (position < firsts_t))[:, None, None],
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


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same attention for a step of one sequence (a long document alone), on the keys
    and values it attends ([keys, kv_heads, head_dim]): two batched matmuls over the heads and
    one softmax."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    ks, vs = (t.float().transpose(0, 1) for t in (k, v))  # [kv_heads, keys, head_dim]
    qs = q.float().view(num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(qs, ks.transpose(1, 2)).mul_(scale)  # [kv_heads, group, keys]
    if bias is not None:  # [keys, heads]
        scores.add_(bias.float().T.reshape(num_kv_heads, num_heads // num_kv_heads, -1))
    out = torch.matmul(scores.softmax(-1), vs)  # [kv_heads, group, head_dim]
    return out.reshape(1, num_heads, head_dim).to(q.dtype)


def scatter_rows(full: torch.Tensor, rows: torch.Tensor, compact: torch.Tensor) -> torch.Tensor:
    """full: [num_tokens, hidden] with compact [num_rows, hidden] written at `rows`, in place;
    the other rows keep what they held (the pooling never reads them)."""
    return full.index_copy_(0, rows, compact.to(full.dtype))
