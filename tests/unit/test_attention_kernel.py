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


def test_long_sequences_take_sdpa_and_the_rest_the_kernel(kernel_build, monkeypatch):
    # fp32 global attention on a build without the flash route (FLASH_BUILDS: AVX2): sequences
    # of SDPA_MIN_LEN tokens or more with every key attended go to torch's SDPA (faster there),
    # the runs between them to the kernel, in one output
    seq_lens, unattended = [7, 300, 33, 130, 150, 5], [1, 0, 0, 4, 0, 0]
    q, k, v = _fused_qkv(seq_lens, 3, 32, seed=7)
    want = _reference(q, k, v, seq_lens, unattended=unattended)
    monkeypatch.setattr(attention_cpu, "SDPA_MIN_LEN", 100)
    monkeypatch.setattr(attention_cpu, "FLASH_BUILDS", ())
    sdpa_lens = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention",
                        lambda qs, *a, **kw: sdpa_lens.append(qs.shape[2]) or real(qs, *a, **kw))
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 32 ** -0.5,
                                         num_unattended=unattended)
    assert sdpa_lens == [300, 150]  # 130 has unattended keys: the kernel's
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    kernel = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 32 ** -0.5,
                                            num_unattended=unattended, long_on_sdpa=False)
    assert sdpa_lens == [300, 150]  # all on the kernel
    torch.testing.assert_close(kernel, want, atol=1e-5, rtol=1e-5)
    bf16 = attention_cpu.attention_on_cpu(*(t.bfloat16() for t in (q, k, v)), seq_lens,
                                          _cu(seq_lens), 32 ** -0.5, num_unattended=unattended)
    assert bf16 is not None and sdpa_lens == [300, 150]  # bf16: its kernels, not routed


@pytest.mark.parametrize("case", ["head size", "float64", "gqa with a bias", "autograd",
                                  "disabled"])
def test_declines_what_it_does_not_cover(case, monkeypatch):
    seq_lens = [5, 9]
    dim = 8 if case == "head size" else 32
    if case == "head size" and dim % build.encoder_kernels().vector_floats == 0:
        pytest.skip("the AVX2 build takes a head size of 8")
    q, k, v = _fused_qkv(seq_lens, 2, dim)
    if case == "float64":
        q, k, v = q.double(), k.double(), v.double()
    bias = None
    if case == "gqa with a bias":  # the decoder entry point has no score bias
        k, v = k[:, :1], v[:, :1]
        bias = {n: torch.zeros(2, n, n) for n in seq_lens}
    if case == "autograd":
        q = q.clone().requires_grad_()
    if case == "disabled":
        monkeypatch.setattr(attention_cpu, "ENABLED", False)
    assert attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), dim ** -0.5,
                                          position_bias=bias) is None


@pytest.fixture
def bf16_kernel():
    """attention_bf16.c, built where the CPU has AVX512_BF16 (else the test skips)."""
    lib = attention_cpu.bf16_attention_kernels()
    if lib is None:
        pytest.skip("the bf16 attention kernel needs AVX512_BF16 (and a C compiler)")
    return lib


@pytest.mark.parametrize("heads,dim", [(2, 32), (3, 64), (2, 48), (2, 16)])
def test_bf16_kernel_matches_sdpa_on_the_same_bf16_values(bf16_kernel, heads, dim):
    """The bf16 engine's case: bf16 q/k/v in, the products exact in fp32, P@V in fp32, a bf16
    result: the reference's answer on the same values, rounded once."""
    q, k, v = (t.to(torch.bfloat16) for t in _fused_qkv(LENGTHS, heads, dim, seed=7))
    expected = _reference(q.float(), k.float(), v.float(), LENGTHS)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5)
    assert got is not None and got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), expected, atol=4e-3, rtol=8e-3)  # one rounding
    bias = {n: torch.randn(heads, n, n) for n in LENGTHS}
    unattended = [0, 3, 0, 10, 1, 299, 0]
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5,
                                         unattended, bias)
    expected = _reference(q.float(), k.float(), v.float(), LENGTHS, bias=bias,
                          unattended=unattended)
    torch.testing.assert_close(got.float(), expected, atol=4e-3, rtol=8e-3)


@pytest.mark.parametrize("source", ["float32", "bfloat16"])
@pytest.mark.parametrize("dim", [32, 64, 48, 16])
def test_bf16_products_for_int8_engines(bf16_kernel, source, dim):
    """bf16_products (int8 engines): fp32 or bf16 q/k/v, q/k/v and P rounded to bf16, an fp32
    result for the int8 output projection; within bf16's rounding of the fp32 answer. Head
    sizes: the query block is transposed 16 queries x 16 dim pairs at a time (48 and 16 end in
    a half-filled group of pairs, 64 takes two groups), and 1, 31, 33 leave a partial group of
    queries."""
    seq_lens = [1, 31, 32, 33, 130, 257]
    q, k, v = _fused_qkv(seq_lens, 3, dim, seed=8)
    expected = _reference(q, k, v, seq_lens)
    dtype = getattr(torch, source)
    fused = torch.stack([q, k, v], 1).to(dtype)  # [tokens, 3, heads, dim]
    got = attention_cpu.attention_on_cpu(fused[:, 0], fused[:, 1], fused[:, 2], seq_lens,
                                         _cu(seq_lens), dim ** -0.5, bf16_products=True)
    assert got is not None and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    cos = F.cosine_similarity(got.reshape(len(q), -1), expected.reshape(len(q), -1))
    assert cos.min() > 0.9999
    # without the flag fp32 inputs keep the fp32 kernel: the reference to fp32 precision
    exact = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), dim ** -0.5)
    torch.testing.assert_close(exact, expected, atol=1e-5, rtol=1e-5)


def test_bf16_kernel_thread_count_does_not_change_the_result(bf16_kernel):
    q, k, v = (t.to(torch.bfloat16) for t in _fused_qkv(LENGTHS, 3, 32, seed=9))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for products in (False, True):
                results.append(attention_cpu.attention_on_cpu(
                    q, k, v, LENGTHS, _cu(LENGTHS), 32 ** -0.5, bf16_products=products))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[i], results[i % 2]) for i in range(2, 6))


def test_bf16_kernel_off_widens_to_the_fp32_kernel(bf16_kernel, monkeypatch):
    """BF16_ENABLED off (as on a CPU without AVX512_BF16): bf16 q/k/v take the fp32 kernel."""
    seq_lens = [9, 65]
    q, k, v = (t.to(torch.bfloat16) for t in _fused_qkv(seq_lens, 2, 32, seed=10))
    monkeypatch.setattr(attention_cpu, "BF16_ENABLED", False)
    assert attention_cpu.bf16_attention_kernels() is None
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, _cu(seq_lens), 32 ** -0.5)
    expected = _reference(q.float(), k.float(), v.float(), seq_lens)
    torch.testing.assert_close(got.float(), expected, atol=4e-3, rtol=8e-3)


def test_bf16_kernel_follows_the_forced_build(bf16_kernel, monkeypatch):
    """POOLER_CPU_KERNELS=avx2 (the AVX2 build forced on an AVX-512 CPU) or 0 leaves the bf16
    kernel out, as on a CPU that could not run it."""
    for choice in ("avx2", "0"):
        monkeypatch.setenv(build.DISABLE_ENV, choice)
        assert attention_cpu.bf16_attention_kernels() is None
    monkeypatch.undo()
    assert attention_cpu.bf16_attention_kernels() is not None


@pytest.mark.parametrize("heads,hidden", [(4, 32), (2, 64)])  # head sizes 8 and 32
def test_int8_qkv_in_bf16_only_where_the_bf16_kernel_takes_it(bf16_kernel, heads, hidden,
                                                              monkeypatch):
    """An int8 BertLayer stores q/k/v in bf16 only for a head size the bf16 kernel runs; any
    other (8 here) keeps them fp32, which the fp32 paths take as before."""
    from pooler.layers.quantization import quantize_linears
    from pooler.models import bert
    from pooler.models.inputs import ModelInputs

    cfg = bert.BertConfig(vocab_size=10, hidden_size=hidden, num_hidden_layers=1,
                          num_attention_heads=heads, intermediate_size=2 * hidden)
    torch.manual_seed(0)
    layer = bert.BertLayer(cfg).eval()
    quantize_linears(layer, keep_fp32=())
    layer.attention_bf16_products = True
    seen = []
    real = bert.packed_attention
    monkeypatch.setattr(bert, "packed_attention",
                        lambda q, *a, **kw: seen.append(q.dtype) or real(q, *a, **kw))
    seq_lens = [60, 70]
    inputs = ModelInputs(input_ids=torch.zeros(130, dtype=torch.long),
                         positions=torch.cat([torch.arange(n) for n in seq_lens]),
                         token_type_ids=None, cu_seqlens=_cu(seq_lens), seq_lens=seq_lens,
                         max_seqlen=70)
    with torch.inference_mode():
        out = layer(torch.randn(130, hidden), inputs)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert seen == [torch.bfloat16 if hidden // heads % 16 == 0 else torch.float32]
