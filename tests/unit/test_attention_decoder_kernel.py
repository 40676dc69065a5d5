"""The C attention kernel's decoder entry point (attention.h, packed_masked_attention_f32):
causal masks, causal sliding windows (Mistral, Gemma3's causal layers) and GQA (k/v heads
fewer than q heads: Gemma3/EmbeddingGemma, Qwen3, Llama), alone and combined, against
per-sequence SDPA with the same mask, on the best build and the AVX2 build forced on an AVX-512
CPU: lengths around its 32-query blocks, one long sequence past the torch paths' 1,024-token
threshold, and the packed_attention calls the decoder models make."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import attention_cpu
from pooler.layers import attention
from pooler.layers.attention import packed_attention

LENGTHS = [1, 7, 33, 64, 130]


def _cu(seq_lens):
    return torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)


def _reference(q, k, v, seq_lens, causal, half_window, scale):
    """Each sequence alone: SDPA under a bool mask built from the definition."""
    out, start = [], 0
    groups = q.shape[1] // k.shape[1]
    for n in seq_lens:
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1)
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        mask = torch.ones(n, n, dtype=torch.bool)
        if causal:
            mask &= j <= i
        if half_window is not None:
            mask &= (i - j).abs() <= half_window
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                  scale=scale)[0].transpose(0, 1))
        start += n
    return torch.cat(out)


def _qkv(seq_lens, heads, kv_heads, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(seq_lens)
    return (torch.randn(n, heads, dim, generator=g), torch.randn(n, kv_heads, dim, generator=g),
            torch.randn(n, kv_heads, dim, generator=g))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (3, 1)])
@pytest.mark.parametrize("causal,half_window", [(True, None), (True, 5), (True, 40),
                                                (False, 9)])
def test_matches_sdpa(kernel_build, heads, kv_heads, causal, half_window):
    if not causal and heads == kv_heads:
        pytest.skip("the bidirectional entry points: test_attention_kernel.py")
    dim = 32
    q, k, v = _qkv(LENGTHS, heads, kv_heads, dim, seed=heads + kv_heads)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5,
                                         half_window=half_window, causal=causal)
    assert got is not None
    torch.testing.assert_close(got, _reference(q, k, v, LENGTHS, causal, half_window,
                                               dim ** -0.5), atol=2e-5, rtol=1e-5)


def test_bidirectional_global_gqa_keeps_sdpa(kernel_build):
    """Measured faster on torch's SDPA (attention_cpu.attention_on_cpu's comment)."""
    q, k, v = _qkv(LENGTHS, 4, 2, 32)
    assert attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 0.2) is None
    assert attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 0.2,
                                          half_window=4) is not None


def test_long_causal_gqa_sequence_and_unattended_keys(kernel_build):
    """One 1,100-token sequence (the torch paths' long threshold is 1,024) with a 64-token
    causal window, GQA, and a trailing unattended key suffix on a second sequence."""
    lens = [1100, 50]
    q, k, v = _qkv(lens, 4, 2, 64, seed=3)
    got = attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 0.125, [0, 6],
                                         half_window=64, causal=True)
    attention_cpu.ENABLED = False
    try:
        expected = packed_attention(q, k, v, lens, _cu(lens), max(lens), causal=True,
                                    half_window=64, scale=0.125, num_unattended=[0, 6])
    finally:
        attention_cpu.ENABLED = True
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_long_fp32_causal_sequences_take_sdpa(kernel_build, monkeypatch, kv_heads):
    """fp32 causal attention without a window: sequences of CAUSAL_SDPA_MIN_LEN tokens or more
    (every key attended) on SDPA with is_causal (enable_gqa for fewer k/v heads), the others of
    the step on the masked kernel; a window or an unattended suffix keeps the kernel."""
    monkeypatch.setattr(attention_cpu, "CAUSAL_SDPA_MIN_LEN", 100)
    lens, unattended = [7, 130, 33, 120, 100], [0, 0, 0, 5, 0]
    q, k, v = _qkv(lens, 4, kv_heads, 32, seed=11)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(qs, *args, **kwargs):
        calls.append((qs.shape[2], kwargs.get("is_causal"), kwargs.get("enable_gqa")))
        return real(qs, *args, **kwargs)
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention", spy)
    got = attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 32 ** -0.5, unattended,
                                         causal=True)
    assert calls == [(130, True, kv_heads != 4), (100, True, kv_heads != 4)]
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention", real)
    attention_cpu.ENABLED = False
    try:
        want = packed_attention(q, k, v, lens, _cu(lens), max(lens), causal=True,
                                scale=32 ** -0.5, num_unattended=unattended)
    finally:
        attention_cpu.ENABLED = True
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    calls.clear()
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention", spy)
    attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 32 ** -0.5, unattended,
                                   causal=True, half_window=16)
    assert calls == []  # a sliding window scores only the band on the kernel


def test_bf16_inputs_widen_and_packed_attention_takes_the_kernel(kernel_build, monkeypatch):
    calls = []
    real = attention.attention_on_cpu
    monkeypatch.setattr(attention, "attention_on_cpu",
                        lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
    q, k, v = _qkv(LENGTHS, 4, 1, 32, seed=9)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    got = packed_attention(q, k, v, LENGTHS, _cu(LENGTHS), max(LENGTHS), causal=True,
                           scale=32 ** -0.5)
    assert len(calls) == 1 and calls[0] is not None and got.dtype == torch.bfloat16
    expected = _reference(q.float(), k.float(), v.float(), LENGTHS, True, None, 32 ** -0.5)
    torch.testing.assert_close(got.float(), expected, atol=1e-2, rtol=1e-2)
