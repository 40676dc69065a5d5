"""packed_biased_attention against a per-sequence reference: a bias that depends on the
sequence's own queries and keys, mixed lengths (runs of equal lengths, chunking), trailing
keys nobody attends to, and the SDPA path (bf16)."""
from __future__ import annotations

import pytest
import torch

from pooler.layers import biased_attention
from pooler.layers.biased_attention import packed_biased_attention

HEADS, DIM = 3, 8


def _bias(qs: torch.Tensor, ks: torch.Tensor) -> torch.Tensor:
    # [n, heads, L, d] x2 -> [n, heads, L, L]: depends on both sides and on positions
    length = qs.shape[-2]
    pos = torch.arange(length, dtype=qs.dtype)
    return (qs.sum(-1, keepdim=True) * 0.1 - ks.sum(-1)[..., None, :] * 0.05
            + (pos[:, None] - pos[None, :]).abs() * 0.02)


def _reference(q, k, v, seq_lens, scale, unattended):
    out, start = [], 0
    for n, skip in zip(seq_lens, unattended):
        qs, ks, vs = (t[start:start + n].transpose(0, 1)[None].float() for t in (q, k, v))
        scores = qs @ ks.transpose(-1, -2) * scale + _bias(qs, ks)
        if skip:
            scores[..., n - skip:] = float("-inf")
        out.append((scores.softmax(-1) @ vs)[0].transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_matches_per_sequence_reference(dtype, atol, monkeypatch):
    monkeypatch.setattr(biased_attention, "_SCORE_BYTES", 2048)  # force several chunks
    seq_lens = [5, 5, 5, 9, 1, 9, 12]
    unattended = [0, 0, 2, 0, 0, 3, 0]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(seq_lens), HEADS, DIM, generator=g) for _ in range(3))
    expected = _reference(q, k, v, seq_lens, 0.3, unattended)
    got = packed_biased_attention(q.to(dtype), k.to(dtype), v.to(dtype), seq_lens, _bias, 0.3,
                                  unattended)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got.float(), expected, atol=atol, rtol=0)


def test_rejects_a_sequence_with_no_attended_key():
    q = torch.randn(4, HEADS, DIM)
    with pytest.raises(ValueError, match="num_unattended"):
        packed_biased_attention(q, q, q, [4], _bias, 1.0, [4])
