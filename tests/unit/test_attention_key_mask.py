"""packed_attention's per-sequence key mask (num_unattended) against padded, key-masked SDPA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.layers.attention import packed_attention


def _reference(q, k, v, seq_lens, unattended, *, causal=False, half_window=None):
    """Each sequence alone through SDPA with an explicit [L, L] mask."""
    out, start = [], 0
    for length, n in zip(seq_lens, unattended):
        idx = torch.arange(length)
        mask = (idx < length - n)[None, :].expand(length, length)
        if causal:
            mask = mask & (idx[None, :] <= idx[:, None])
        if half_window is not None:
            mask = mask & ((idx[:, None] - idx[None, :]).abs() <= half_window)
        qs, ks, vs = (t[start:start + length].transpose(0, 1)[None] for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
        out.append(o[0].transpose(0, 1))
        start += length
    return torch.cat(out)


@pytest.mark.parametrize("causal,half_window", [(False, None), (False, 2), (True, None)])
def test_key_mask_matches_per_sequence_reference(causal, half_window):
    torch.manual_seed(0)
    # Equal lengths with different counts (must not share a mask), a run of equal counts,
    # and sequences with no mask at all, in one packed batch.
    seq_lens = [6, 6, 6, 9, 4, 6]
    unattended = [2, 2, 0, 3, 0, 5]
    total = sum(seq_lens)
    q, k, v = (torch.randn(total, 2, 8) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(seq_lens).cumsum(0).tolist(), dtype=torch.int32)
    ours = packed_attention(q, k, v, seq_lens, cu, max(seq_lens), causal=causal,
                            half_window=half_window, num_unattended=unattended)
    expected = _reference(q, k, v, seq_lens, unattended, causal=causal,
                          half_window=half_window)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    # The masked keys change the result (the test can fail), and zero counts are the fast path.
    unmasked = packed_attention(q, k, v, seq_lens, cu, max(seq_lens), causal=causal,
                                half_window=half_window)
    assert not torch.allclose(ours[:6], unmasked[:6], atol=1e-3)
    torch.testing.assert_close(ours[12:18], unmasked[12:18])
    zeros = packed_attention(q, k, v, seq_lens, cu, max(seq_lens), causal=causal,
                             half_window=half_window, num_unattended=[0] * len(seq_lens))
    torch.testing.assert_close(zeros, unmasked)


def test_masking_every_token_is_an_error():
    q = torch.randn(4, 1, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="num_unattended"):
        packed_attention(q, q, q, [4], cu, 4, num_unattended=[4])
