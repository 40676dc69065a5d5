"""The bf16 attention kernel's key-block units for long global sequences
(attention_bf16_flash.h, routed by attention_cpu.BF16_FLASH_MIN_LEN through
packed_tiled_attention_bf16) against fp32 SDPA on each sequence alone, at the bf16 kernel
tests' tolerances (test_attention_kernel.py): ragged lengths around its 128-query units and
240-key blocks packed with short sequences that keep the whole-sequence units, head sizes 64
and 32, the bf16 engine's mode (P@V in fp32, bf16 out) and bf16_products (P rounded, fp32
out), unattended suffixes (odd key blocks), thread-count invariance, and the calls that keep
the old units (score bias, local attention). Skips where the bf16 kernel does not run (no
AVX512_BF16, or the AVX2 build forced)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.cpu_features import cpu_features
from pooler.kernels import attention_cpu

LENGTHS = [1, 17, 300, 1100, 2049]
UNATTENDED = [0, 3, 0, 101, 1000]  # 999 and 1049 keys: odd last key blocks


@pytest.fixture(autouse=True)
def bf16_kernel_on_its_own(monkeypatch):
    if attention_cpu.bf16_attention_kernels() is None:
        pytest.skip("the bf16 attention kernel needs AVX512_BF16 (and a C compiler)")
    monkeypatch.setattr(attention_cpu, "BF16_SDPA_ENABLED", False)  # the kernel at any length
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 256)  # 300, 1100, 2049 tiled
    # the tiled units on this CPU whatever its kind (the shipped kinds: a test below)
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_CPU_KINDS", (cpu_features().kind(),))


def _cu(seq_lens):
    return torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)


def _reference(q, k, v, seq_lens, unattended=None):
    """Each sequence alone through fp32 SDPA, unattended keys masked."""
    out, start = [], 0
    for i, n in enumerate(seq_lens):
        qs, ks, vs = (t[start:start + n].float().transpose(0, 1)[None] for t in (q, k, v))
        mask = None
        if unattended and unattended[i]:
            mask = torch.zeros(n, n)
            mask[:, n - unattended[i]:] = float("-inf")
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)[0].transpose(0, 1))
        start += n
    return torch.cat(out)  # [tokens, heads, dim]


def _fused_qkv(dim, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(sum(LENGTHS), 3, 2, dim, generator=g).to(dtype)  # a fused projection
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


def _run(q, k, v, unattended=None, products=False, **kw):
    return attention_cpu.attention_on_cpu(q, k, v, LENGTHS, _cu(LENGTHS), q.shape[2] ** -0.5,
                                          unattended, bf16_products=products, **kw)


def _long_rows_differ(a, b):
    """The tiled units sum in another order: the long sequences' rows differ from the
    whole-sequence units' somewhere, the short ones' (same units) not at all."""
    short = sum(LENGTHS[:2])
    assert torch.equal(a[:short], b[:short])
    assert not torch.equal(a[short:], b[short:])


@pytest.mark.parametrize("dim", [64, 32])
@pytest.mark.parametrize("unattended", [None, UNATTENDED])
def test_bf16_engine_mode_matches_sdpa(dim, unattended, monkeypatch):
    """bf16 q/k/v in, P@V in fp32, a bf16 result: the reference's answer on the same values,
    rounded once."""
    q, k, v = _fused_qkv(dim, 1, torch.bfloat16)
    got = _run(q, k, v, unattended)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), _reference(q, k, v, LENGTHS, unattended),
                               atol=4e-3, rtol=8e-3)
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 0)
    _long_rows_differ(got, _run(q, k, v, unattended))


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 32])
@pytest.mark.parametrize("unattended", [None, UNATTENDED])
def test_bf16_products_mode_matches_sdpa(source, dim, unattended, monkeypatch):
    """bf16_products (int8 engines): q/k/v and P rounded to bf16, an fp32 result; within
    bf16's rounding of the fp32 answer."""
    q, k, v = _fused_qkv(dim, 2, source)
    got = _run(q, k, v, unattended, products=True)
    assert got.dtype == torch.float32
    expected = _reference(q, k, v, LENGTHS, unattended)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    cos = F.cosine_similarity(got.reshape(len(q), -1), expected.reshape(len(q), -1))
    assert cos.min() > 0.9999
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 0)
    _long_rows_differ(got, _run(q, k, v, unattended, products=True))


def test_thread_count_does_not_change_the_result():
    q, k, v = _fused_qkv(32, 3, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for products in (False, True):
                results.append(_run(q, k, v, UNATTENDED, products=products))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[i], results[i % 2]) for i in range(2, 6))


def test_score_bias_and_local_attention_keep_the_whole_sequence_units(monkeypatch):
    """The tiled units take global attention without a bias only: a biased or local call gives
    the old units' result bit for bit."""
    q, k, v = _fused_qkv(32, 4, torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    bias = {n: torch.randn(2, n, n, generator=g) for n in LENGTHS}
    tiled = [_run(q, k, v, position_bias=bias), _run(q, k, v, half_window=40)]
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 0)
    whole = [_run(q, k, v, position_bias=bias), _run(q, k, v, half_window=40)]
    assert all(torch.equal(a, b) for a, b in zip(tiled, whole))


def test_default_threshold_routes_from_bf16_flash_min_len(monkeypatch):
    """With the shipped threshold, a sequence of BF16_FLASH_MIN_LEN tokens takes the tiled
    units and one token shorter keeps the whole-sequence units."""
    monkeypatch.undo()  # the module's own BF16_FLASH_MIN_LEN
    monkeypatch.setattr(attention_cpu, "BF16_SDPA_ENABLED", False)
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_CPU_KINDS", (cpu_features().kind(),))
    n = attention_cpu.BF16_FLASH_MIN_LEN
    assert n > 0
    g = torch.Generator().manual_seed(6)
    qkv = torch.randn(2 * n - 1, 3, 1, 32, generator=g).bfloat16()  # [tokens, 3, heads, dim]
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    lens = [n - 1, n]

    def run():
        return attention_cpu.attention_on_cpu(q, k, v, lens, _cu(lens), 32 ** -0.5)

    default = run()
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 0)
    whole = run()
    assert torch.equal(default[:n - 1], whole[:n - 1])
    assert not torch.equal(default[n - 1:], whole[n - 1:])
    torch.testing.assert_close(default.float(), _reference(q, k, v, lens), atol=4e-3, rtol=8e-3)
    # a CPU kind the tiled units were not measured on keeps the whole-sequence units
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", n)
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_CPU_KINDS", ())
    assert torch.equal(run(), whole)


# flash sequences (256 tokens or more here) of odd and even lengths and attended key counts,
# with short whole-sequence ones between them: each head's K and V of the flash sequences are
# laid out once per call, one after another, so an odd sequence (or key count) shifts where
# every later one starts
MIXED = [257, 17, 511, 300, 3, 481]
MIXED_UNATTENDED = [0, 2, 30, 1, 0, 100]  # keys: 257, 15, 481 (a 1-key last block), 299, 3, 381


@pytest.mark.parametrize("mode", ["bf16", "int8", "int8f32"])
def test_flash_sequences_of_odd_and_even_lengths_beside_short_ones(mode, monkeypatch):
    products = mode != "bf16"
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(sum(MIXED), 3, 2, 64, generator=g)  # [tokens, 3, heads, dim]
    qkv = qkv.to(torch.float32 if mode == "int8f32" else torch.bfloat16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]

    def run():
        return attention_cpu.attention_on_cpu(q, k, v, MIXED, _cu(MIXED), 64 ** -0.5,
                                              MIXED_UNATTENDED, bf16_products=products)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        got = run()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, got)
    expected = _reference(q, k, v, MIXED, MIXED_UNATTENDED)
    if products:
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    else:
        torch.testing.assert_close(got.float(), expected, atol=4e-3, rtol=8e-3)
    # the flash sequences took the key-block units (other sums than the whole-sequence
    # units'), the short ones the whole-sequence units (the same sums)
    monkeypatch.setattr(attention_cpu, "BF16_FLASH_MIN_LEN", 0)
    whole = run()
    starts = [0, *torch.tensor(MIXED).cumsum(0).tolist()]
    for i, n in enumerate(MIXED):
        rows = slice(starts[i], starts[i + 1])
        assert torch.equal(got[rows], whole[rows]) == (n < 256), (i, n)
