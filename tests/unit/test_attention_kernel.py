"""The C attention kernel for packed sequences (pooler/kernels/attention_cpu.py, attention.h)
against scaled_dot_product_attention on each sequence alone, in both builds (AVX-512 and AVX2,
forced on an AVX-512 machine): lengths around its 32-query blocks and 12-row tiles, head sizes
that take one- and two-vector tiles, q/k/v as views of one fused projection or as separate
tensors, bf16 inputs, MPNet's score bias, ColBERT's unattended keys, and thread-count
invariance."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import attention_cpu, build
from pooler.layers import attention
from pooler.layers.attention import packed_attention

pytestmark = pytest.mark.skipif(
    build.encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")

LENGTHS = [1, 7, 16, 33, 128, 300, 513]


@pytest.fixture(params=["best", "avx2"])
def kernel_build(request, monkeypatch):
    """encoder_kernels() as the best build for this CPU, or as the AVX2 one."""
    if request.param == "avx2":
        if not build.cpu_features().avx2:
            pytest.skip("no AVX2 here")
        monkeypatch.setenv(build.DISABLE_ENV, "avx2")
    build.encoder_kernels.cache_clear()
    lib = build.encoder_kernels()
    assert lib is not None and (request.param != "avx2" or lib.variant == "avx2")
    yield lib
    monkeypatch.undo()
    build.encoder_kernels.cache_clear()


def _cu(seq_lens):
    return torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)


def _reference(q, k, v, seq_lens, scale=None, bias=None, unattended=None):
    """Each sequence alone: SDPA, with an additive float mask for a bias or unattended keys."""
    out, start = [], 0
    for i, n in enumerate(seq_lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))  # [1,h,n,d]
        mask = None
        if bias is not None or unattended:
            mask = bias[n].clone() if bias is not None else torch.zeros(q.shape[1], n, n)
            if unattended and unattended[i]:
                mask[..., n - unattended[i]:] = float("-inf")
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                  scale=scale)[0].transpose(0, 1))
        start += n
    return torch.cat(out)


def _fused_qkv(seq_lens, heads, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(sum(seq_lens), 3, heads, dim, generator=g)  # as BertLayer's projection
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


@pytest.mark.parametrize("heads,dim", [(2, 32), (3, 64), (2, 48), (2, 16)])
def test_matches_per_sequence_sdpa(kernel_build, heads, dim):
    q, k, v = _fused_qkv(LENGTHS, heads, dim)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5)
    assert got is not None and got.shape == q.shape and got.is_contiguous()
    torch.testing.assert_close(got, _reference(q, k, v, LENGTHS), atol=1e-5, rtol=1e-5)


def test_separate_tensors_and_a_custom_scale(kernel_build):
    seq_lens = [5, 40, 33]
    q, k, v = (t.contiguous() for t in _fused_qkv(seq_lens, 4, 32, seed=3))  # row stride 128
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 0.3)
    torch.testing.assert_close(got, _reference(q, k, v, seq_lens, scale=0.3), atol=1e-5,
                               rtol=1e-5)


def test_position_bias_and_unattended_keys(kernel_build):
    seq_lens, unattended = [7, 33, 300, 1, 33], [2, 0, 100, 0, 32]
    heads = 2
    q, k, v = _fused_qkv(seq_lens, heads, 32, seed=1)
    g = torch.Generator().manual_seed(2)
    bias = {n: torch.randn(heads, n, n, generator=g) for n in set(seq_lens)}
    cu = _cu(seq_lens)
    for b, u in ((bias, None), (None, unattended), (bias, unattended)):
        got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, cu, 32 ** -0.5, u, b)
        torch.testing.assert_close(got, _reference(q, k, v, seq_lens, bias=b, unattended=u),
                                   atol=1e-5, rtol=1e-5)
    plain = attention_cpu.attention_on_cpu(q, k, v, seq_lens, cu, 32 ** -0.5)
    assert not torch.allclose(plain, got, atol=1e-3)  # the bias and the mask changed it


def test_bf16_inputs_run_fp32_math(kernel_build):
    seq_lens = [9, 65, 200]
    q, k, v = _fused_qkv(seq_lens, 2, 32, seed=6)
    fused = torch.stack([q, k, v], 1).to(torch.bfloat16)  # [tokens, 3, heads, dim]
    expected = _reference(*(fused[:, i].float() for i in range(3)), seq_lens)  # same values
    # views of one fused projection (widened in one pass), then three separate tensors
    for q, k, v in ((fused[:, 0], fused[:, 1], fused[:, 2]),
                    tuple(fused[:, i].contiguous() for i in range(3))):
        got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 32 ** -0.5)
        assert got is not None and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), expected, atol=4e-3, rtol=8e-3)  # one rounding


def test_thread_count_does_not_change_the_result(kernel_build):
    q, k, v = _fused_qkv(LENGTHS, 3, 32, seed=4)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS),
                                                          32 ** -0.5))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_packed_attention_takes_the_kernel_when_it_can(monkeypatch):
    calls = []
    real = attention.attention_on_cpu
    monkeypatch.setattr(attention, "attention_on_cpu",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    seq_lens = [3, 70, 70, 200]
    q, k, v = _fused_qkv(seq_lens, 2, 32, seed=5)
    got = packed_attention(q, k, v, seq_lens, _cu(seq_lens), max(seq_lens))
    assert calls == [1]
    monkeypatch.setattr(attention_cpu, "ENABLED", False)  # the torch paths: same answer
    torch.testing.assert_close(got, packed_attention(q, k, v, seq_lens, _cu(seq_lens),
                                                     max(seq_lens)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["head size", "float64", "gqa", "autograd", "disabled"])
def test_declines_what_it_does_not_cover(case, monkeypatch):
    seq_lens = [5, 9]
    dim = 8 if case == "head size" else 32
    if case == "head size" and dim % build.encoder_kernels().vector_floats == 0:
        pytest.skip("the AVX2 build takes a head size of 8")
    q, k, v = _fused_qkv(seq_lens, 2, dim)
    if case == "float64":
        q, k, v = q.double(), k.double(), v.double()
    if case == "gqa":
        k, v = k[:, :1], v[:, :1]
    if case == "autograd":
        q = q.clone().requires_grad_()
    if case == "disabled":
        monkeypatch.setattr(attention_cpu, "ENABLED", False)
    assert attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), dim ** -0.5) is None
