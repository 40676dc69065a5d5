"""Long bf16 and int8 attention on torch's SDPA in bf16 (pooler/kernels/attention_cpu.py,
_long_sequences_on_sdpa; its fp32 causal route: test_attention_decoder_kernel.py): which
sequences of a packed step go there (long, global or causal, every key attended) and which stay
on the kernels, the answers against fp32 SDPA at the tolerances the kernel tests use for bf16,
in both kernel builds, and the rule that keeps bf16 off it on a CPU without AMX-BF16 or with
torch held to AVX2."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler import cpu_features as cf
from pooler.kernels import attention_cpu, build

pytestmark = pytest.mark.skipif(
    build.encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")

# short and long mixed around BF16_SDPA_MIN_LEN (1,024); 1,030 has an unattended suffix
# (ColBERT): the kernel's
LENGTHS = [7, 1100, 33, 1030, 5, 1024, 1023]
UNATTENDED = [0, 0, 1, 4, 0, 0, 0]


def _cu(seq_lens):
    return torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)


def _reference(q, k, v, seq_lens, scale, causal=False, unattended=None):
    """Each sequence alone through fp32 SDPA on the same values."""
    out, start = [], 0
    for i, n in enumerate(seq_lens):
        qs, ks, vs = (t[start:start + n].float().transpose(0, 1)[None] for t in (q, k, v))
        mask = None
        if unattended and unattended[i]:
            mask = torch.ones(n, n, dtype=torch.bool)
            mask[:, n - unattended[i]:] = False
            if causal:
                mask = mask.tril()
        out.append(F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=scale, is_causal=causal and mask is None,
            enable_gqa=ks.shape[1] != qs.shape[1])[0].transpose(0, 1))
        start += n
    return torch.cat(out)


def _qkv(seq_lens, heads, kv_heads, dim, dtype, seed=0):
    """q/k/v as views of one fused projection's rows, as the models pass them."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(sum(seq_lens), (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    q = fused[:, :heads * dim].view(-1, heads, dim)
    k = fused[:, heads * dim:(heads + kv_heads) * dim].view(-1, kv_heads, dim)
    v = fused[:, (heads + kv_heads) * dim:].view(-1, kv_heads, dim)
    return q, k, v


def _sdpa_bf16_runs() -> bool:
    """Whether torch's SDPA runs bf16 at these shapes here: torch 2.13 held to AVX2
    (ATEN_CPU_CAPABILITY=avx2) on a CPU with AVX512_BF16 raises ("pack_vnni2 is only supported
    when avx512 is supported"), which bf16_sdpa_is_fast() keeps the route from."""
    x = torch.randn(1, 4, 1100, 64).bfloat16()
    try:
        F.scaled_dot_product_attention(x, x, x)
        F.scaled_dot_product_attention(x, x[:, :2], x[:, :2], is_causal=True, enable_gqa=True)
    except RuntimeError:
        return False
    return True


@pytest.fixture
def routed(monkeypatch):
    """The route on whatever this CPU is (its answers are torch's on any CPU where torch's
    bf16 SDPA runs), and a record of the [1, heads, L, d] SDPA calls: (L, dtype)."""
    if not _sdpa_bf16_runs():
        pytest.skip("torch's bf16 SDPA raises here (torch held to AVX2 on an AVX512_BF16 CPU)")
    monkeypatch.setattr(attention_cpu, "bf16_sdpa_is_fast", lambda: True)
    calls = []
    real = F.scaled_dot_product_attention

    def spy(qs, *args, **kwargs):
        if qs.dtype == torch.bfloat16:  # (the references run fp32 SDPA)
            calls.append((qs.shape[2], qs.dtype))
        return real(qs, *args, **kwargs)
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("dim", [64, 32])
def test_bf16_engine_long_sequences_on_sdpa(kernel_build, routed, dim):
    """bf16 q/k/v, a bf16 result: 1,100 and 1,024 on SDPA bf16, the rest on the kernel (the bf16
    kernel, or the fp32 one with the AVX2 build), within one bf16 rounding of fp32 SDPA."""
    q, k, v = _qkv(LENGTHS, 3, 3, dim, torch.bfloat16, seed=1)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5,
                                         num_unattended=UNATTENDED)
    assert routed == [(1100, torch.bfloat16), (1024, torch.bfloat16)]
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    want = _reference(q, k, v, LENGTHS, dim ** -0.5, unattended=UNATTENDED)
    torch.testing.assert_close(got.float(), want, atol=4e-3, rtol=8e-3)
    routed.clear()
    # long_on_sdpa=False: all on the kernels, the same answer to bf16 rounding
    kernel = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), dim ** -0.5,
                                            num_unattended=UNATTENDED, long_on_sdpa=False)
    assert routed == []
    torch.testing.assert_close(kernel.float(), want, atol=4e-3, rtol=8e-3)


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16])
def test_int8_engine_long_sequences_on_sdpa(kernel_build, routed, source):
    """bf16_products (int8 engines): fp32 or bf16 q/k/v, the long ones rounded to bf16 for
    SDPA, an fp32 result where the bf16 kernel runs the rest (else q's dtype, as the kernel
    paths return); within the int8 tests' bf16 tolerance of fp32 SDPA on fp32 values."""
    q, k, v = _qkv(LENGTHS, 2, 2, 64, torch.float32, seed=2)
    want = _reference(q, k, v, LENGTHS, 0.125)
    got = attention_cpu.attention_on_cpu(*(t.to(source) for t in (q, k, v)), LENGTHS,
                                         _cu(LENGTHS), 0.125, bf16_products=True)
    assert routed == [(1100, torch.bfloat16), (1030, torch.bfloat16), (1024, torch.bfloat16)]
    bf16_kernel = attention_cpu.bf16_attention_kernels() is not None
    assert got.dtype == (torch.float32 if bf16_kernel else source)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    cos = F.cosine_similarity(got.float().reshape(len(q), -1), want.reshape(len(q), -1))
    assert cos.min() > 0.9999


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_causal_and_gqa_bf16_on_sdpa(kernel_build, routed, kv_heads):
    """Decoder-style bf16 attention (causal, k/v heads a divisor of q's): the long sequences on
    SDPA bf16 with is_causal / enable_gqa instead of the fp32 masked kernel on widened q/k/v."""
    q, k, v = _qkv(LENGTHS, 4, kv_heads, 64, torch.bfloat16, seed=3)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 0.125,
                                         num_unattended=UNATTENDED, causal=True)
    assert routed == [(1100, torch.bfloat16), (1024, torch.bfloat16)]
    assert got.dtype == torch.bfloat16
    want = _reference(q, k, v, LENGTHS, 0.125, causal=True, unattended=UNATTENDED)
    torch.testing.assert_close(got.float(), want, atol=4e-3, rtol=8e-3)


@pytest.mark.parametrize("case", ["local", "sliding window", "fp32", "bias"])
def test_band_fp32_and_bias_stay_off_the_bf16_route(kernel_build, routed, case):
    """Local attention (ModernBERT) and a causal sliding window score only the band on the
    kernels (faster than SDPA's masked L x L); fp32 is not this route's (the fp32 kernels'
    SDPA_MIN_LEN is 1536); a score bias (MPNet) stays on the kernel."""
    lens = [40, 1100]
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    q, k, v = _qkv(lens, 2, 2, 64, dtype, seed=4)
    bias = {n: torch.zeros(2, n, n) for n in lens} if case == "bias" else None
    got = attention_cpu.attention_on_cpu(
        q, k, v, lens, _cu(lens), 0.125, position_bias=bias,
        half_window=64 if case in ("local", "sliding window") else None,
        causal=case == "sliding window")
    assert got is not None and routed == []


def test_the_route_needs_amx_and_avx512_torch(monkeypatch):
    """bf16_sdpa_is_fast(): AMX-BF16 (where it was measured faster) and torch dispatching its
    AVX-512 kernels; a CPU without AMX keeps bf16 on its kernels (no SDPA call), as does torch
    held to AVX2 (SDPA bf16 raises there on an AMX CPU)."""
    lens = [1100]
    q, k, v = _qkv(lens, 2, 2, 64, torch.bfloat16, seed=5)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention",
                        lambda qs, *a, **kw: calls.append(qs.shape[2]) or real(qs, *a, **kw))
    here = cf.cpu_features().flags
    try:
        monkeypatch.setenv(cf.FLAGS_ENV, " ".join(here - {"amx_bf16", "amx_tile", "amx_int8"}))
        cf.cpu_features.cache_clear()
        assert not attention_cpu.bf16_sdpa_is_fast()
        got = attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 0.125)
        assert got is not None and calls == []
        monkeypatch.setenv(cf.FLAGS_ENV, " ".join(here | {"amx_bf16", "amx_tile"}))
        cf.cpu_features.cache_clear()
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
        assert not attention_cpu.bf16_sdpa_is_fast()
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
        assert attention_cpu.bf16_sdpa_is_fast()
        monkeypatch.setattr(attention_cpu, "BF16_SDPA_ENABLED", False)
        assert not attention_cpu.bf16_sdpa_is_fast()
    finally:
        monkeypatch.undo()
        cf.cpu_features.cache_clear()


def test_causal_fp32_qkv_with_bf16_products(kernel_build, routed):
    """A decoder whose engine allows bf16 products (what a Llama/Qwen3 layer of an int8 or bf16
    engine would pass: fp32 q/k/v, `bf16_products=True`): the long sequences rounded to bf16 for
    SDPA, the rest on the fp32 masked kernel, an fp32 result within bf16's tolerance."""
    q, k, v = _qkv(LENGTHS, 4, 2, 64, torch.float32, seed=6)
    want = _reference(q, k, v, LENGTHS, 0.125, causal=True, unattended=UNATTENDED)
    got = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 0.125,
                                         num_unattended=UNATTENDED, causal=True,
                                         bf16_products=True)
    assert routed == [(1100, torch.bfloat16), (1024, torch.bfloat16)]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    cos = F.cosine_similarity(got.reshape(len(q), -1), want.reshape(len(q), -1))
    assert cos.min() > 0.9999
    # without the flag fp32 stays fp32 (no SDPA bf16)
    routed.clear()
    exact = attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), 0.125,
                                           num_unattended=UNATTENDED, causal=True)
    assert routed == []
    torch.testing.assert_close(exact, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_the_rule_as_it_is_here(causal):
    """Whatever this CPU and torch build decide (the route on AMX with torch's AVX-512 kernels,
    else the kernels), a long bf16 call runs and agrees with fp32 SDPA: also under
    ATEN_CPU_CAPABILITY=avx2, where torch's bf16 SDPA would raise."""
    lens = [9, 1100]
    q, k, v = _qkv(lens, 2, 2, 64, torch.bfloat16, seed=7)
    got = attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 0.125, causal=causal)
    assert got is not None and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), _reference(q, k, v, lens, 0.125, causal=causal),
                               atol=4e-3, rtol=8e-3)
