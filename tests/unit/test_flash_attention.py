"""The flash kernel for long fp32 global attention (flash_attention.h, attention_cpu's
flash_attention and its routing) against torch's SDPA on each sequence alone, in both builds
(AVX-512 and AVX2, forced on an AVX-512 machine): ragged lengths around its 128-query units and
240-key blocks packed in one call, head sizes that take P@V tiles of 1-4 vectors, q/k/v as
views of one fused projection or as separate tensors, an unattended suffix, thread-count
invariance, and which path a step's sequences take."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.cpu_features import cpu_features
from pooler.kernels import attention_cpu, build

pytestmark = pytest.mark.skipif(
    build.encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")


def _reference(q, k, v, seq_lens, scale, unattended=None):
    """Each sequence alone through SDPA, unattended keys masked."""
    out, start = [], 0
    for i, n in enumerate(seq_lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None] for t in (q, k, v))  # [1,h,n,d]
        mask = None
        if unattended and unattended[i]:
            mask = torch.zeros(n, n)
            mask[:, n - unattended[i]:] = float("-inf")
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                  scale=scale)[0].transpose(0, 1))
        start += n
    return torch.cat(out)


def _fused_qkv(seq_lens, heads, dim, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(sum(seq_lens), 3, heads, dim, generator=g) * spread  # a fused projection
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


def _flash(lib, q, k, v, seq_lens, scale, unattended=None):
    flash = attention_cpu._entry_points(lib, "flash")
    assert flash is not None
    strides = [t.stride(0) for t in (q, k, v)]
    return attention_cpu.flash_attention(flash, q, k, v, strides, seq_lens, scale, unattended)


@pytest.mark.parametrize("heads,dim", [(2, 64), (1, 32), (1, 128), (1, 48), (1, 80), (2, 16)])
def test_matches_sdpa_at_ragged_lengths(kernel_build, heads, dim):
    seq_lens = [1, 17, 1000, 2049, 240, 129]
    q, k, v = _fused_qkv(seq_lens, heads, dim)
    got = _flash(kernel_build, q, k, v, seq_lens, dim ** -0.5)
    assert got.shape == q.shape and got.is_contiguous()
    torch.testing.assert_close(got, _reference(q, k, v, seq_lens, dim ** -0.5), atol=2e-5,
                               rtol=2e-5)


def test_peaked_rows_against_float64(kernel_build):
    # scores with a std of ~4 (q, k twice as wide): fp32 rounding of the scores alone moves
    # torch's own fp32 SDPA 1.1e-5 from float64 here; the kernel stays within 3e-5 of it
    seq_lens = [1000, 2049]
    q, k, v = _fused_qkv(seq_lens, 2, 64, seed=4, spread=2.0)
    got = _flash(kernel_build, q, k, v, seq_lens, 0.125)
    want = _reference(q.double(), k.double(), v.double(), seq_lens, 0.125)
    torch.testing.assert_close(got.double(), want, atol=3e-5, rtol=0)


def test_separate_tensors_unattended_suffix_and_threads(kernel_build):
    seq_lens, unattended = [300, 5, 513], [40, 0, 273]
    q, k, v = (t.contiguous() for t in _fused_qkv(seq_lens, 3, 32, seed=3))  # row stride 96
    want = _reference(q, k, v, seq_lens, 0.3, unattended)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _flash(kernel_build, q, k, v, seq_lens, 0.3, unattended)
        torch.set_num_threads(2)
        two = _flash(kernel_build, q, k, v, seq_lens, 0.3, unattended)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one, want, atol=2e-5, rtol=2e-5)
    assert torch.equal(one, two)  # each output element by one thread, in a fixed order


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_heads_in_groups_with_a_partial_last_group(kernel_build, threads):
    # K and V are copied a group of heads at a time (flash_group_heads: 8 units per thread):
    # ~1,800 tokens make 8 units per head (AVX-512; 15 on AVX2), so 5 heads run as groups of
    # 2, 2 and 1 on 2 threads, 3 + 2 on 3 threads, one at a time on 1 thread
    seq_lens, unattended = [700, 1100, 3], [0, 100, 0]
    q, k, v = _fused_qkv(seq_lens, 5, 32, seed=5)
    want = _reference(q, k, v, seq_lens, 0.2, unattended)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = _flash(kernel_build, q, k, v, seq_lens, 0.2, unattended)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_long_sequences_take_the_flash_kernel_on_its_builds(kernel_build, monkeypatch):
    # fp32 global attention: runs of sequences of FLASH_MIN_LEN tokens or more take the flash
    # kernel (on FLASH_BUILDS; SDPA on the others), the runs between them attention.h's kernel
    seq_lens, unattended = [7, 300, 150, 33, 130, 5], [1, 0, 0, 0, 4, 0]
    q, k, v = _fused_qkv(seq_lens, 3, 32, seed=7)
    want = _reference(q, k, v, seq_lens, 32 ** -0.5, unattended)
    monkeypatch.setattr(attention_cpu, "FLASH_MIN_LEN", 100)
    monkeypatch.setattr(attention_cpu, "SDPA_MIN_LEN", 100)
    flash_lens, sdpa_lens = [], []
    real_flash, real_sdpa = attention_cpu.flash_attention, F.scaled_dot_product_attention
    monkeypatch.setattr(attention_cpu, "flash_attention",
                        lambda lib, q, k, v, st, lens, *a: flash_lens.append(lens)
                        or real_flash(lib, q, k, v, st, lens, *a))
    monkeypatch.setattr(attention_cpu.F, "scaled_dot_product_attention",
                        lambda qs, *a, **kw: sdpa_lens.append(qs.shape[2]) or real_sdpa(qs, *a,
                                                                                         **kw))
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, torch.tensor(
        [0, *seq_lens]).cumsum(0).int(), 32 ** -0.5, num_unattended=unattended)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    if attention_cpu.flash_route_here(kernel_build.variant, 32):
        assert flash_lens == [[300, 150], [130]] and sdpa_lens == []  # unattended keys too
    else:
        assert flash_lens == [] and sdpa_lens == [300, 150]  # 130 has unattended keys
    # a CPU kind the flash kernel was not measured on keeps the SDPA route
    flash_lens.clear(), sdpa_lens.clear()
    monkeypatch.setattr(attention_cpu, "FLASH_CPU_KINDS", ())
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, torch.tensor(
        [0, *seq_lens]).cumsum(0).int(), 32 ** -0.5, num_unattended=unattended)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert flash_lens == [] and sdpa_lens == [300, 150]
    monkeypatch.setattr(attention_cpu, "FLASH_CPU_KINDS", (cpu_features().kind(),))
    # heads wider than FLASH_MAX_HEAD_DIM: the SDPA route on every build
    flash_lens.clear(), sdpa_lens.clear()
    monkeypatch.setattr(attention_cpu, "FLASH_MAX_HEAD_DIM", 16)
    got = attention_cpu.attention_on_cpu(q, k, v, seq_lens, torch.tensor(
        [0, *seq_lens]).cumsum(0).int(), 32 ** -0.5, num_unattended=unattended)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert flash_lens == [] and sdpa_lens == [300, 150]
