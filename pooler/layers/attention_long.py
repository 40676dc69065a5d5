"""The torch paths of packed_attention for long sequences: never an [L, L] mask or score matrix.

Where the C kernel does not run (GQA, causal, other head sizes, no compiler,
`POOLER_CPU_KERNELS=0`, CUDA fp32), the short paths build an [L, L] bool mask (`_band_mask`,
`_key_mask`) and SDPA computes the whole L x L product under it: at 8k tokens a ModernBERT local
layer (128-token window) does ~60x the work it needs, and the masks and scores grow as L^2.

- Local attention (`banded_attention`): the sequence is cut into blocks of `block` queries; a
  block sees only the keys of its queries' bands (block + left + right keys: left = the half
  window, right = the half window, or 0 when causal), gathered as overlapping windows
  (`unfold`) so that all blocks run as one batched SDPA call per chunk of blocks, under one
  [blocks, block, span] mask that the windows share. Work O(L (block + 2w)), memory O(chunk).
- Global attention (`query_chunked_attention`): SDPA over chunks of queries against all keys
  (a causal chunk only against the keys up to its last query), masks built per chunk:
  memory O(chunk x L).

Semantics are exactly the short paths': query i sees key j when |i - j| <= half_window (and,
if causal, j <= i), j is before the sequence's unattended suffix, and a query that sees no key
gets zeros (as SDPA gives for a fully masked row).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Sequences longer than these take the paths here (shorter ones keep the tuned short paths).
BANDED_MIN_LEN = 512
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


def banded_attention(
    q: torch.Tensor,  # [count, L, heads, head_dim]
    k: torch.Tensor,  # [count, L, kv_heads, head_dim]
    v: torch.Tensor,  # [count, L, kv_heads, head_dim]
    out: torch.Tensor,  # [count, L, heads, head_dim] written in place
    half_window: int,
    causal: bool,
    unattended: int,  # trailing keys nobody attends to (the same for the whole group)
    scale: float | None,
) -> None:
    count, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    block = band_block(half_window)
    left, right = half_window, 0 if causal else half_window
    span = block + left + right  # keys one block sees
    blocks = -(-length // block)
    attended = length - unattended
    device = q.device
    # Key t of block b's window is token b * block - left + t; query r of it is b * block + r.
    r = torch.arange(block, device=device)[:, None]
    t = torch.arange(span, device=device)[None, :]
    rel = r - t + left  # query - key
    in_band = (rel >= -right) & (rel <= left)  # [block, span], the same for every block
    starts = torch.arange(blocks, device=device)[:, None] * block - left  # [blocks, 1]
    key_pos = starts + torch.arange(span, device=device)[None, :]  # [blocks, span]
    mask = in_band[None] & ((key_pos >= 0) & (key_pos < attended))[:, None, :]
    # [blocks, block, span] bool

    # zero rows around the sequence: `left` before, and after it up to the last window's end
    pad_after = blocks * block + right - length
    kp = F.pad(k, (0, 0, 0, 0, left, pad_after))  # [count, left + blocks*block + right, kvh, d]
    vp = F.pad(v, (0, 0, 0, 0, left, pad_after))
    qp = F.pad(q, (0, 0, 0, 0, 0, blocks * block - length))  # [count, blocks*block, heads, d]
    per_block = count * heads * block * span
    chunk = max(1, _CALL_SCORES // per_block)
    for b0 in range(0, blocks, chunk):
        b1 = min(blocks, b0 + chunk)
        n = b1 - b0
        # [count * n, heads, block, head_dim]
        qb = (qp[:, b0 * block:b1 * block].view(count, n, block, heads, head_dim)
              .permute(0, 1, 3, 2, 4).reshape(count * n, heads, block, head_dim))
        rows = slice(b0 * block, b1 * block + left + right)
        # windows of `span` rows every `block` rows: [count, n, kv_heads, head_dim, span]
        kb, vb = ((x[:, rows].unfold(1, span, block).permute(0, 1, 2, 4, 3)
                   .reshape(count * n, kv_heads, span, head_dim)) for x in (kp, vp))
        mb = mask[b0:b1, None].expand(n, 1, block, span)
        if count > 1:
            mb = mb[None].expand(count, n, 1, block, span).reshape(count * n, 1, block, span)
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mb, scale=scale,
                                           enable_gqa=kv_heads != heads)
        # o: [count * n, heads, block, head_dim] -> tokens b0*block .. of each sequence
        o = o.view(count, n, heads, block, head_dim).permute(0, 1, 3, 2, 4)
        o = o.reshape(count, n * block, heads, head_dim)
        end = min(length, b1 * block)
        out[:, b0 * block:end].copy_(o[:, :end - b0 * block])


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
                mask = mask & (keys[:end][None, :] <= torch.arange(a, b, device=qs.device)[:, None])
            mask = mask.expand(b - a, end)
        if bias is not None:
            rows = bias[:, a:b, :end]  # [heads, chunk, end]
            mask = rows if mask is None else rows.masked_fill(~mask, float("-inf"))
        o = F.scaled_dot_product_attention(qs[:, :, a:b], ks[:, :, :end], vs[:, :, :end],
                                           attn_mask=mask, scale=scale,
                                           enable_gqa=ks.shape[1] != heads)
        out[:, a:b].copy_(o.transpose(1, 2))  # [count, chunk, heads, head_dim]
