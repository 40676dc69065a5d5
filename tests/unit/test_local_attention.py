"""Local (banded) attention without an [L, L] product: the C kernel's band (attention.h, both
builds: AVX-512 and AVX2 forced; attention_bf16.c where the CPU has AVX512_BF16) and the torch
paths for long sequences
(pooler/layers/attention_long.py), each against the masked reference (`_band_mask` and SDPA in
float64 on each sequence alone): lengths around and across the kernel's 32-query blocks,
windows 0..128, unattended suffixes (some queries then see no key at all: zeros), several
packed sequences, causal windows and GQA on the torch paths."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import attention_cpu, build
from pooler.layers import attention, attention_long
from pooler.layers.attention import _band_mask, _key_mask, packed_attention

LENGTHS = [1, 31, 32, 33, 200, 700]
WINDOWS = [8, 16, 31, 64, 128]

needs_kernel = pytest.mark.skipif(
    build.encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")


def _cu(seq_lens):
    return torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)


def _reference(q, k, v, seq_lens, half_window, causal=False, unattended=None, scale=None):
    """Each sequence alone, in float64, under the short path's [L, L] masks."""
    out, start = [], 0
    for i, n in enumerate(seq_lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None].double() for t in (q, k, v))
        if half_window is not None:
            mask = _band_mask(n, half_window, causal, "cpu")
        else:
            mask = torch.ones(n, n, dtype=torch.bool)
            mask = mask.tril() if causal else mask
        if unattended and unattended[i]:
            mask = mask & _key_mask(n, unattended[i], causal, "cpu")
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale,
                                           enable_gqa=qs.shape[1] != ks.shape[1])
        out.append(o[0].transpose(0, 1).float())
        start += n
    return torch.cat(out)


def _qkv(seq_lens, heads, dim, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(seq_lens)
    if kv_heads is None:  # views of one fused projection, as ModernBERT's Wqkv
        qkv = torch.randn(n, 3, heads, dim, generator=g)
        return qkv[:, 0], qkv[:, 1], qkv[:, 2]
    return (torch.randn(n, heads, dim, generator=g), torch.randn(n, kv_heads, dim, generator=g),
            torch.randn(n, kv_heads, dim, generator=g))


@needs_kernel
@pytest.mark.parametrize("half_window", WINDOWS)
def test_kernel_band_equals_the_masked_reference(kernel_build, half_window):
    q, k, v = _qkv(LENGTHS, 2, 32, seed=half_window)
    for unattended in (None, [0, 3, 0, 10, 1, 299]):
        got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 32 ** -0.5,
                                             unattended, half_window=half_window)
        assert got is not None and torch.isfinite(got).all()
        expected = _reference(q, k, v, LENGTHS, half_window, unattended=unattended)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("heads,dim", [(3, 64), (2, 16), (2, 48)])
def test_kernel_band_head_sizes_and_edges(kernel_build, heads, dim):
    """One- and two-vector tiles; a window of 0 (each query sees itself), 1, and one wider than
    every sequence (the full product)."""
    seq_lens = [33, 200, 95]
    q, k, v = _qkv(seq_lens, heads, dim, seed=dim)
    for half_window in (0, 1, 500):
        got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), dim ** -0.5,
                                             half_window=half_window)
        torch.testing.assert_close(got, _reference(q, k, v, seq_lens, half_window),
                                   atol=1e-5, rtol=1e-5)
    # a window of 0 is each query's own value
    own = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), dim ** -0.5,
                                         half_window=0)
    torch.testing.assert_close(own, v, atol=1e-6, rtol=1e-6)


@needs_kernel
def test_kernel_band_with_a_score_bias_and_the_thread_count(kernel_build):
    seq_lens, heads = [40, 130], 2
    q, k, v = _qkv(seq_lens, heads, 32, seed=3)
    g = torch.Generator().manual_seed(4)
    bias = {n: torch.randn(heads, n, n, generator=g) for n in seq_lens}
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 32 ** -0.5,
                                         position_bias=bias, half_window=8)
    expected, start = [], 0
    for n in seq_lens:
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None].double() for t in (q, k, v))
        mask = bias[n].double().masked_fill(~_band_mask(n, 8, False, "cpu"), float("-inf"))
        expected.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)[0]
                        .transpose(0, 1).float())
        start += n
    torch.testing.assert_close(got, torch.cat(expected), atol=1e-5, rtol=1e-5)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens),
                                                          32 ** -0.5, half_window=8))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@needs_kernel
def test_packed_attention_sends_local_layers_to_the_kernel(monkeypatch):
    calls = []
    real = attention.attention_on_cpu
    signature = inspect.signature(real)

    def spy(*a, **kw):
        # the window by name: the kernel's signature grows (causal windows came after it)
        calls.append(signature.bind(*a, **kw).arguments.get("half_window"))
        return real(*a, **kw)

    monkeypatch.setattr(attention, "attention_on_cpu", spy)
    seq_lens = [700, 33]
    q, k, v = _qkv(seq_lens, 2, 32, seed=5)
    got = packed_attention(q, k, v, seq_lens, _cu(seq_lens), 700, half_window=64)
    assert calls == [64]
    torch.testing.assert_close(got, _reference(q, k, v, seq_lens, 64), atol=1e-5, rtol=1e-5)


def test_kernel_declines_a_negative_window():
    q, k, v = _qkv([5], 2, 32)
    if build.encoder_kernels() is None:
        pytest.skip("no kernel here")
    with pytest.raises(ValueError, match="half_window"):
        attention_cpu.attention_on_cpu(q, k, v, [5], _cu([5]), 1.0, half_window=-1)


@pytest.fixture
def bf16_kernel():
    """attention_bf16.c, built where the CPU has AVX512_BF16 (else the test skips)."""
    lib = attention_cpu.bf16_attention_kernels()
    if lib is None:
        pytest.skip("the bf16 attention kernel needs AVX512_BF16 (and a C compiler)")
    return lib


@pytest.mark.parametrize("half_window", [8, 31, 64, 128])
@pytest.mark.parametrize("products", [False, True])
def test_bf16_kernel_band(bf16_kernel, half_window, products):
    """bf16 q/k/v (the bf16 engine; with `products` an int8 engine's rounded P too) under a
    band: the reference on the same bf16 values, within bf16's rounding. Odd band starts test
    the kernel's even key pairs; the unattended suffix leaves some queries no key (zeros)."""
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(LENGTHS, 2, 32, seed=half_window + 1))
    for unattended in (None, [0, 3, 0, 10, 1, 299]):
        got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 32 ** -0.5,
                                             unattended, bf16_products=products,
                                             half_window=half_window)
        assert got is not None and torch.isfinite(got.float()).all()
        assert got.dtype == (torch.float32 if products else torch.bfloat16)
        expected = _reference(q.float(), k.float(), v.float(), LENGTHS, half_window,
                              unattended=unattended)
        tol = 2e-2 if products else 8e-3
        torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)
        if unattended:  # the last queries of the 700-token sequence see no key
            assert (got[-(299 - half_window - 1):].float() == 0).all()


@pytest.fixture
def torch_paths(monkeypatch):
    """The C kernel off and the long paths from short lengths, so that small tensors take
    them (what a GQA, causal or kernel-less model does at long lengths)."""
    monkeypatch.setattr(attention_cpu, "ENABLED", False)
    monkeypatch.setattr(attention_long, "BANDED_MIN_LEN", 40)
    monkeypatch.setattr(attention_long, "CHUNKED_MIN_LEN", 40)
    monkeypatch.setattr(attention_long, "_CALL_SCORES", 3000)  # several chunks per call


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [None, 1])
@pytest.mark.parametrize("half_window", [None, 3, 8, 31, 64])
def test_torch_long_paths_equal_the_masked_reference(torch_paths, causal, kv_heads,
                                                     half_window):
    seq_lens = [700, 200, 200, 33, 1, 130]
    q, k, v = _qkv(seq_lens, 4, 16, kv_heads=kv_heads, seed=7)
    for unattended in (None, [10, 0, 0, 5, 0, 100]):
        got = packed_attention(q, k, v, seq_lens, _cu(seq_lens), 700, causal=causal,
                               half_window=half_window, num_unattended=unattended, scale=0.3)
        assert torch.isfinite(got).all()
        expected = _reference(q, k, v, seq_lens, half_window, causal, unattended, scale=0.3)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_torch_long_paths_never_build_an_L_by_L_mask(torch_paths, monkeypatch):
    """At long lengths neither _band_mask nor _key_mask is asked for, and the banded path's
    SDPA calls see only [block, span] scores."""
    def forbidden(*args):
        raise AssertionError(f"an [L, L] mask was built: {args}")
    monkeypatch.setattr(attention, "_band_mask", forbidden)
    monkeypatch.setattr(attention, "_key_mask", forbidden)
    shapes = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(attention_long.F, "scaled_dot_product_attention",
                        lambda q, k, *a, **kw: shapes.append((q.shape[-2], k.shape[-2]))
                        or real(q, k, *a, **kw))
    seq_lens = [700, 300]
    q, k, v = _qkv(seq_lens, 2, 16, kv_heads=1, seed=8)
    packed_attention(q, k, v, seq_lens, _cu(seq_lens), 700, causal=True, half_window=16,
                     num_unattended=[4, 0])
    block = attention_long.band_block(16)
    assert shapes and all(s == (block, block + 16) for s in shapes)
    shapes.clear()  # global attention: chunks of queries (64 rows at this _CALL_SCORES)
    packed_attention(q, k, v, seq_lens, _cu(seq_lens), 700, num_unattended=[4, 0])
    assert len(shapes) == 11 + 5 and all(rows <= 64 for rows, _ in shapes)
