"""The torch paths of packed_attention for long sequences: never an [L, L] mask or score matrix.

Where the C kernel does not run (GQA, causal, other head sizes, no compiler,
`POOLER_CPU_KERNELS=0`, CUDA fp32), the short paths build an [L, L] bool mask (`_band_mask`,
`_key_mask`) and SDPA computes the whole L x L product under it: at 8k tokens a ModernBERT local
layer (128-token window) does ~60x the work it needs, and the masks and scores grow as L^2.

- Local attention (`banded_attention`): the sequence is cut into blocks of `block` queries; a
  block sees only the keys of its queries' bands (span = block + left + right keys: left = the
  half window, right = the half window, or 0 when causal), gathered as overlapping windows so
  that a chunk of blocks runs as one batched SDPA call under a [blocks, block, span] additive
  mask (cached per length: the model's local layers share it). Work O(L (block + 2w)), memory
  O(L span) for the mask and O(chunk) for the rest.
- Global attention (`query_chunked_attention`): SDPA over chunks of queries against all keys
  (a causal chunk only against the keys up to its last query), masks built per chunk:
  memory O(chunk x L).

Semantics are exactly the short paths': query i sees key j when |i - j| <= half_window (and,
if causal, j <= i), j is before the sequence's unattended suffix, and a query that sees no key
gets zeros (as SDPA gives for a fully masked row).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

# Sequences longer than these take the paths here (shorter ones keep the tuned short paths).
# The blocked band's SDPA calls on [64 x 192] blocks run at a third to half of the FLOP rate of
# one large call: at 1,024 tokens (5x less work) it only ties the masked product, from 2,048
# it is 7-8x faster (docs/dev/journal.md, "Long documents: banded local attention").
BANDED_MIN_LEN = 1024
CHUNKED_MIN_LEN = 1024
# Score elements one SDPA call may hold (its math backend materialises them: float64, or
# where no fused kernel takes the call): 16M, 64 MB in fp32.
_CALL_SCORES = 16 * 2**20


def band_block(half_window: int) -> int:
    """Queries per block for a band of half_window keys each side: the block's span is
    block + 2 half_window keys, of which each query uses 2 half_window + 1, so a smaller block
    wastes less; 32 to 128 keeps the calls' matmuls large enough (64 for ModernBERT's 64)."""
    return max(32, min(128, -(-half_window // 32) * 32))


def takes_banded(length: int, half_window: int) -> bool:
    """Whether a sequence of `length` tokens with this band takes banded_attention: long, and
    the band well short of the sequence (else the full product costs little more)."""
    span = band_block(half_window) + 2 * half_window
    return length > BANDED_MIN_LEN and length >= 2 * span


@lru_cache(maxsize=8)
def _band_layout(length: int, half_window: int, causal: bool, unattended: int,
                 dtype: torch.dtype, device: torch.device
                 ) -> tuple[list[int], list[int], torch.Tensor, int, int]:
    """Where each block's queries and keys are, and the mask they share.

    Block b's queries start at b * block (the last block at L - block: it overlaps the one
    before, whose rows it computes again) and its keys at its first query minus the left half
    window, clamped into [0, L - span]: every window lies inside the sequence, no padding.
    Returns each block's first query row and first key row, the additive mask
    [blocks, 1, block, span] (0 where the key is in the query's band and attended, -inf
    elsewhere), and the range [lo, hi) of regular blocks, whose windows start every `block`
    rows (b * block, and b * block - left for the keys) and can be strided views."""
    block = band_block(half_window)
    left, right = half_window, 0 if causal else half_window
    span = min(length, block + left + right)
    blocks = -(-length // block)
    regular_start = torch.arange(blocks) * block
    q_start = regular_start.clamp(max=length - block)  # [blocks]
    k_start = (q_start - left).clamp(min=0, max=length - span)
    regular = ((q_start == regular_start) & (k_start == q_start - left)).nonzero().flatten()
    lo, hi = (int(regular[0]), int(regular[-1]) + 1) if len(regular) else (0, 0)
    q_rows = q_start[:, None] + torch.arange(block)  # [blocks, block]
    k_rows = k_start[:, None] + torch.arange(span)  # [blocks, span]
    rel = q_rows[:, :, None] - k_rows[:, None, :]  # query - key: [blocks, block, span]
    keep = (rel >= -right) & (rel <= left) & (k_rows < length - unattended)[:, None, :]
    mask = torch.zeros(keep.shape, dtype=dtype).masked_fill_(~keep, float("-inf"))
    return q_start.tolist(), k_start.tolist(), mask[:, None].to(device), lo, hi


def _windows(x: torch.Tensor,  # [L, heads, head_dim], head_dim contiguous
             first_row: int, rows: int, count: int, step: int
             ) -> torch.Tensor:  # [count, heads, rows, head_dim], a view (windows may overlap)
    row_stride, head_stride, _ = x.stride()
    return x.as_strided((count, x.shape[1], rows, x.shape[2]),
                        (step * row_stride, head_stride, row_stride, 1),
                        x.storage_offset() + first_row * row_stride)


def takes_chunked(length: int) -> bool:
    """Whether global attention over `length` tokens takes query_chunked_attention."""
    return length > CHUNKED_MIN_LEN


def banded_attention(
    q: torch.Tensor,  # [count, L, heads, head_dim]
    k: torch.Tensor,  # [count, L, kv_heads, head_dim]
    v: torch.Tensor,  # [count, L, kv_heads, head_dim]
    out: torch.Tensor,  # [count, L, heads, head_dim] contiguous, written in place
    half_window: int,
    causal: bool,
    unattended: int,  # trailing keys nobody attends to (the same for the whole group)
    scale: float | None,
) -> None:
    count, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    q_start, k_start, mask, lo, hi = _band_layout(length, half_window, causal, unattended,
                                                  q.dtype, q.device)
    blocks, _, block, span = mask.shape
    chunk = max(1, _CALL_SCORES // (heads * block * span))  # blocks per SDPA call
    gqa = kv_heads != heads
    for s in range(count):  # long documents rarely share a length: one at a time
        # regular blocks: strided views of the rows, no copies in
        for b0 in range(lo, hi, chunk):
            n = min(hi, b0 + chunk) - b0
            qb = _windows(q[s], b0 * block, block, n, block)  # [n, heads, block, head_dim]
            kb, vb = (_windows(x[s], b0 * block - half_window, span, n, block)
                      for x in (k, v))  # [n, kv_heads, span, head_dim]
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask[b0:b0 + n],
                                               scale=scale, enable_gqa=gqa)
            out[s, b0 * block:(b0 + n) * block].view(n, block, heads, head_dim).copy_(
                o.transpose(1, 2))
        # the few blocks at the sequence's edges, one call each
        for b in (*range(lo), *range(hi, blocks)):
            qb = _windows(q[s], q_start[b], block, 1, block)  # [1, heads, block, head_dim]
            kb, vb = (_windows(x[s], k_start[b], span, 1, block) for x in (k, v))
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask[b:b + 1],
                                               scale=scale, enable_gqa=gqa)
            out[s, q_start[b]:q_start[b] + block].copy_(o[0].transpose(0, 1))


def query_chunked_attention(
    qs: torch.Tensor,  # [count, heads, L, head_dim]
    ks: torch.Tensor,  # [count, kv_heads, L, head_dim]
    vs: torch.Tensor,  # [count, kv_heads, L, head_dim]
    out: torch.Tensor,  # [count, L, heads, head_dim] written in place
    causal: bool,
    unattended: int,
    scale: float | None,
    bias: torch.Tensor | None = None,  # [heads, L, L] added to the scores
) -> None:
    count, heads, length, _ = qs.shape
    chunk = max(64, _CALL_SCORES // (count * heads * length) // 64 * 64)
    attended = length - unattended
    keys = torch.arange(length, device=qs.device)
    for a in range(0, length, chunk):
        b = min(length, a + chunk)
        end = b if causal else length  # a causal chunk sees no key after its last query
        mask = None
        if causal or unattended:
            mask = (keys[:end] < attended)[None, :]  # [1 or chunk, end]
            if causal:
                queries = torch.arange(a, b, device=qs.device)[:, None]
                mask = mask & (keys[:end][None, :] <= queries)
            mask = mask.expand(b - a, end)
        if bias is not None:
            rows = bias[:, a:b, :end]  # [heads, chunk, end]
            mask = rows if mask is None else rows.masked_fill(~mask, float("-inf"))
        o = F.scaled_dot_product_attention(qs[:, :, a:b], ks[:, :, :end], vs[:, :, :end],
                                           attn_mask=mask, scale=scale,
                                           enable_gqa=ks.shape[1] != heads)
        out[:, a:b].copy_(o.transpose(1, 2))  # [count, chunk, heads, head_dim]
