"""Attention over packed sequences: never computes a padded position.

CPU, fp32 or bf16 q/k/v, head size a multiple of 16 (8 on AVX2): one C call over all the step's
sequences (pooler/kernels/attention_cpu.py: fp32, or bf16 dot products for bf16 q/k/v and, with
`bf16_products`, for an int8 engine's), bias, unattended keys and local attention
(`half_window`: only each query block's band of keys is scored) included; causal masks, causal
sliding windows and windowed or causal GQA (decoder embedders) on the fp32 kernel. On the long
mix's steps it takes 1.5-1.9x less CPU time than the torch paths below (5-8x less wall time at
2 threads on a loaded machine, where their many small parallel ops wait on each other); whole
MiniLM jobs 6-15% faster in fp32 and bf16 (docs/dev/journal.md, "Attention in one C call").
Where it does not apply (other head sizes, bidirectional global GQA, a score bias with GQA or a
causal mask, no compiler, `POOLER_CPU_KERNELS=0`), the torch paths: sequences of equal length
share one call.
Long sequences there (pooler/layers/attention_long.py) never build an [L, L] mask or score
matrix: local attention runs in blocks of queries over their band's keys, global attention in
chunks of queries. In fp32, sequences up to _MATH_MAX_LEN tokens run as two batched matmuls and
a softmax, in chunks whose [chunk, heads, L, L] scores fit in L2 (_SCORE_BYTES); measured 8-57%
faster per token than torch's CPU flash kernel for L <= 200 and slower from L = 256, which runs
the longer ones.
CUDA: torch's varlen flash kernel for fp16/bf16 when this torch's signature can express the
pattern (causal, local window, GQA: see varlen_kwargs), else the per-sequence SDPA path.
Optional per-sequence key mask (`num_unattended`): the last n tokens of a sequence are computed
as queries but no token attends to them (ColBERT query expansion); on the torch paths,
sequences with a count run on the per-sequence path with a [L, L] mask, never padded.
Optional additive score bias per sequence length (`position_bias`, MPNet's relative position
bias): {length: [heads, L, L]} added to the scaled scores before the softmax; it never takes
the varlen kernel, whose signature has no bias.
"""
from __future__ import annotations

import inspect
from functools import lru_cache

import torch
import torch.nn.functional as F

from pooler.kernels.attention_cpu import attention_on_cpu
from pooler.layers.attention_long import (banded_attention, query_chunked_attention,
                                          takes_banded, takes_chunked)

try:  # torch >= 2.9 ships a varlen flash-attention entry point (CUDA only).
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
    _VARLEN_PARAMS = frozenset(inspect.signature(_varlen_attn).parameters)
except ImportError:  # pragma: no cover - older torch
    _varlen_attn, _VARLEN_PARAMS = None, frozenset()


def varlen_kwargs(causal: bool, half_window: int | None, scale: float | None, gqa: bool,
                  params: frozenset[str] = _VARLEN_PARAMS) -> dict | None:
    """Keyword arguments that ask this torch's varlen_attn for this attention pattern, or None
    when its signature cannot express it (the per-sequence path runs instead). Its keywords
    changed across releases: causal and local attention are `window_size=(left, right)` (flash
    semantics: query i sees keys i-left..i+right, -1 unbounded) in torch 2.13."""
    kwargs: dict = {}
    if scale is not None:
        if "scale" not in params:
            return None
        kwargs["scale"] = scale
    if causal or half_window is not None:
        if "window_size" in params:
            left = -1 if half_window is None else half_window
            kwargs["window_size"] = (left, 0 if causal else left)
        elif "is_causal" in params and half_window is None:
            kwargs["is_causal"] = True
        else:
            return None
    if gqa:
        if "enable_gqa" not in params:
            return None
        kwargs["enable_gqa"] = True
    return kwargs


# Longest sequence the fp32 matmul path takes, and the score bytes one chunk of it may hold.
_MATH_MAX_LEN = 192
_SCORE_BYTES = 2 * 2**20
# ...except for groups this small, where one SDPA call beats the matmul path's eight ops:
# 34 vs 50 us for one 12-token sequence of 12 heads x 32, 20 vs 32 us at 4 tokens, still ahead
# for two sequences; from 8 sequences or 64 tokens the matmul path wins again (2 threads,
# benchmarks/attention_paths.py).
_SDPA_MAX_COUNT = 2
_SDPA_MAX_LEN = 32


def _math_attention(qs: torch.Tensor,  # [count, heads, L, head_dim]
                    ks: torch.Tensor, vs: torch.Tensor, scale: float,
                    out: torch.Tensor,  # [count * L, heads, head_dim] destination rows
                    bias: torch.Tensor | None = None,  # [heads, L, L] added to the scores
                    ) -> None:
    count, heads, length, head_dim = qs.shape
    per_chunk = max(1, _SCORE_BYTES // (heads * length * length * qs.element_size()))
    for a in range(0, count, per_chunk):
        b = min(count, a + per_chunk)
        scores = torch.matmul(qs[a:b], ks[a:b].transpose(-1, -2)).mul_(scale)  # [n, h, L, L]
        if bias is not None:
            scores += bias
        o = torch.matmul(_softmax_last(scores), vs[a:b])  # [n, heads, L, head_dim]
        out[a * length:b * length].view(b - a, length, heads, head_dim).copy_(o.transpose(1, 2))


def _softmax_last(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim. torch's CPU kernel is slow for rows of 9-15 values (one
    partial AVX-512 vector each: 31 us vs 19 us for this form on a [1, 12, 12, 12] query,
    8 us at 16), which is where short queries land; elsewhere it is the faster one."""
    if 8 < scores.shape[-1] < 16 and scores.device.type == "cpu":
        scores = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
        return scores.div_(scores.sum(-1, keepdim=True))
    return scores.softmax(-1)


@lru_cache(maxsize=64)
def _band_mask(seq_len: int, half_window: int, causal: bool, device_type: str) -> torch.Tensor:
    """[seq_len, seq_len] bool mask, True where |i - j| <= half_window (local attention) and,
    if causal, j <= i (a causal sliding window: Mistral, Gemma3's causal local layers)."""
    idx = torch.arange(seq_len)
    mask = (idx[:, None] - idx[None, :]).abs() <= half_window
    return (mask.tril() if causal else mask).to(device_type)


@lru_cache(maxsize=64)
def _key_mask(seq_len: int, num_unattended: int, causal: bool,
              device_type: str) -> torch.Tensor:
    """[seq_len, seq_len] bool mask, True for keys before the last num_unattended tokens
    (and, if causal, not after the query)."""
    keep = torch.arange(seq_len) < seq_len - num_unattended
    mask = keep[None, :].expand(seq_len, seq_len)
    if causal:
        mask = mask.tril()
    return mask.contiguous().to(device_type)


def packed_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    seq_lens: list[int],
    cu_seqlens: torch.Tensor,  # [num_seqs + 1] int32
    max_seqlen: int,
    *,
    causal: bool = False,
    half_window: int | None = None,
    scale: float | None = None,
    num_unattended: list[int] | None = None,  # [num_seqs] trailing keys nobody attends to
    position_bias: dict[int, torch.Tensor] | None = None,  # length -> [heads, L, L]
    bf16_products: bool = False,  # fp32 q/k/v may take bf16 products (int8 engines)
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if position_bias is not None and causal:
        raise ValueError("position_bias is implemented for bidirectional attention only.")
    if num_unattended is not None and not any(num_unattended):
        num_unattended = None
    enable_gqa = num_heads != num_kv_heads
    if num_unattended is not None:
        for length, unattended in zip(seq_lens, num_unattended):
            if unattended >= length:
                raise ValueError(f"num_unattended must leave at least one attended token: got "
                                 f"{unattended} for a sequence of {length}.")
    if q.device.type == "cpu":
        out = attention_on_cpu(q, k, v, seq_lens, cu_seqlens,
                               scale if scale is not None else q.shape[-1] ** -0.5,
                               num_unattended, position_bias, bf16_products, half_window,
                               causal)
        if out is not None:
            return out
    if (_varlen_attn is not None and q.is_cuda
            and num_unattended is None  # key masks: the per-sequence path below
            and position_bias is None
            and q.dtype in (torch.float16, torch.bfloat16)):
        kwargs = varlen_kwargs(causal, half_window, scale, enable_gqa)
        if kwargs is not None:
            return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                **kwargs)
    out = None
    start = 0
    i = 0
    n = len(seq_lens)
    while i < n:
        length = seq_lens[i]
        # Consecutive sequences of the same length (and key mask) run as one batched call.
        unattended = 0 if num_unattended is None else num_unattended[i]
        j = i + 1
        while j < n and seq_lens[j] == length and (
                num_unattended is None or num_unattended[j] == unattended):
            j += 1
        count = j - i
        end = start + count * length
        bias = None if position_bias is None else position_bias[length]  # [heads, L, L]
        long_path = (takes_banded(length, half_window) if half_window is not None
                     else takes_chunked(length))
        if long_path and (bias is None or half_window is None):
            if out is None:
                out = torch.empty_like(q)
            # [count, L, heads, head_dim] views of the packed rows
            qs, ks, vs, os = (t[start:end].view(count, length, t.shape[1], -1)
                              for t in (q, k, v, out))
            if half_window is not None:
                banded_attention(qs, ks, vs, os, half_window, causal, unattended, scale)
            else:
                query_chunked_attention(*(t.transpose(1, 2) for t in (qs, ks, vs)), os, causal,
                                        unattended, scale, bias)
            start = end
            i = j
            continue
        # [count, heads, length, head_dim]
        qs = q[start:end].view(count, length, num_heads, -1).transpose(1, 2)
        ks = k[start:end].view(count, length, num_kv_heads, -1).transpose(1, 2)
        vs = v[start:end].view(count, length, num_kv_heads, -1).transpose(1, 2)
        mask = _band_mask(length, half_window, causal, q.device.type) if half_window is not None \
            else None
        if unattended:
            key_mask = _key_mask(length, unattended, causal, q.device.type)
            mask = key_mask if mask is None else mask & key_mask
        math_ok = (not enable_gqa and length <= _MATH_MAX_LEN and q.device.type == "cpu"
                   and q.dtype == torch.float32
                   and not (bias is None and count <= _SDPA_MAX_COUNT
                            and length <= _SDPA_MAX_LEN))
        if bias is not None and mask is not None:
            # A float mask is added to the scores: the bias, -inf where the bool mask says no.
            bias, mask = None, bias.masked_fill(~mask, float("-inf"))
        if mask is None and not causal and math_ok:
            if out is None:
                out = torch.empty_like(q)
            _math_attention(qs, ks, vs, scale if scale is not None else q.shape[-1] ** -0.5,
                            out[start:end], bias)
        else:
            mask = bias if bias is not None else mask
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                               is_causal=causal and mask is None, scale=scale,
                                               enable_gqa=enable_gqa)
            if count * length == q.shape[0]:  # one group is the whole batch: no out buffer
                return o.transpose(1, 2).reshape(q.shape[0], num_heads, -1)
            if out is None:
                out = torch.empty_like(q)
            # One strided copy straight into place (reshape-then-assign would copy twice).
            out[start:end].view(count, length, num_heads, -1).copy_(o.transpose(1, 2))
        start = end
        i = j
    return out if out is not None else torch.empty_like(q)
