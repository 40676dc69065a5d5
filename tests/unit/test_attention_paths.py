"""packed_attention's torch CPU paths (chunked matmul+softmax up to _MATH_MAX_LEN, SDPA beyond and
for groups of at most _SDPA_MAX_COUNT short sequences) give the same result as SDPA on each
sequence alone; varlen_kwargs speaks each varlen_attn signature or declines. The C kernel that
runs before them where it can is off here (tests/unit/test_attention_kernel.py covers it)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import attention_cpu
from pooler.layers import attention
from pooler.layers.attention import packed_attention, varlen_kwargs


@pytest.fixture(autouse=True)
def torch_paths_only(monkeypatch):
    monkeypatch.setattr(attention_cpu, "ENABLED", False)


def _per_sequence_sdpa(q, k, v, seq_lens):
    out, start = [], 0
    for length in seq_lens:
        qs, ks, vs = (t[start:start + length].transpose(0, 1)[None] for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1))
        start += length
    return torch.cat(out)


@pytest.mark.parametrize("seq_lens", [
    [12],                                      # one short query
    [7, 7, 7, 30, 30],                         # small groups next to a larger one
    [40] * 9 + [41, 7, 7],                     # runs of equal lengths, several chunks
    [150, 150, 192, 193, 250],                 # both sides of _MATH_MAX_LEN
])
def test_cpu_paths_match_per_sequence_sdpa(seq_lens, monkeypatch):
    monkeypatch.setattr(attention, "_SCORE_BYTES", 64 * 1024)  # force several chunks
    torch.manual_seed(0)
    total, heads, dim = sum(seq_lens), 4, 16
    q, k, v = (torch.randn(total, heads, dim) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int32)
    got = packed_attention(q, k, v, seq_lens, cu, max(seq_lens))
    torch.testing.assert_close(got, _per_sequence_sdpa(q, k, v, seq_lens), atol=1e-5,
                               rtol=1e-5)
    monkeypatch.setattr(attention, "_SDPA_MAX_COUNT", 0)  # matmul path up to 192: same answer
    torch.testing.assert_close(packed_attention(q, k, v, seq_lens, cu, max(seq_lens)), got,
                               atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(attention, "_MATH_MAX_LEN", 0)  # SDPA everywhere: same answer
    torch.testing.assert_close(packed_attention(q, k, v, seq_lens, cu, max(seq_lens)), got,
                               atol=1e-5, rtol=1e-5)


def test_small_groups_take_sdpa_larger_ones_the_matmul_path(monkeypatch):
    groups = []  # (count, length) of each group the matmul path ran
    real = attention._math_attention
    monkeypatch.setattr(attention, "_math_attention",
                        lambda qs, *a, **kw: groups.append(tuple(qs.shape[:3:2])) or
                        real(qs, *a, **kw))
    seq_lens = [12, 20, 20, 9, 9, 9, 40]
    q, k, v = (torch.randn(sum(seq_lens), 4, 16) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int32)
    packed_attention(q, k, v, seq_lens, cu, max(seq_lens))
    assert groups == [(3, 9), (1, 40)]  # one and two sequences of <= 32 tokens: SDPA


WINDOW_API = frozenset({"scale", "window_size", "enable_gqa"})  # torch 2.13
CAUSAL_FLAG_API = frozenset({"is_causal", "scale"})              # an older spelling
BARE_API = frozenset()


def test_varlen_kwargs_window_size_api():
    assert varlen_kwargs(False, None, None, False, WINDOW_API) == {}
    assert varlen_kwargs(True, None, 0.5, False, WINDOW_API) == {"scale": 0.5,
                                                                  "window_size": (-1, 0)}
    assert varlen_kwargs(False, 64, None, False, WINDOW_API) == {"window_size": (64, 64)}
    assert varlen_kwargs(True, 64, None, True, WINDOW_API) == {"window_size": (64, 0),
                                                                "enable_gqa": True}


def test_varlen_kwargs_declines_what_the_signature_cannot_say():
    assert varlen_kwargs(True, None, None, False, CAUSAL_FLAG_API) == {"is_causal": True}
    assert varlen_kwargs(False, 64, None, False, CAUSAL_FLAG_API) is None  # no local window
    assert varlen_kwargs(False, None, None, True, CAUSAL_FLAG_API) is None  # no GQA
    assert varlen_kwargs(False, None, None, False, BARE_API) == {}
    assert varlen_kwargs(True, None, None, False, BARE_API) is None
    assert varlen_kwargs(False, None, 0.5, False, BARE_API) is None
