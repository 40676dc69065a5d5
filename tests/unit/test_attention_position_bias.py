"""packed_attention's per-length additive score bias (MPNet's relative position bias) on both
CPU paths (fp32 matmul up to _MATH_MAX_LEN, SDPA with a float mask beyond) and combined with a
key mask (num_unattended), against a plain softmax(q k^T * scale + bias) per sequence."""
from __future__ import annotations

import pytest
import torch

from pooler.layers.attention import packed_attention


def _reference(q, k, v, seq_lens, bias, unattended):
    out, start = [], 0
    for length, skip in zip(seq_lens, unattended):
        qs, ks, vs = (t[start:start + length].transpose(0, 1) for t in (q, k, v))  # [h, L, d]
        scores = qs @ ks.transpose(-1, -2) * qs.shape[-1] ** -0.5 + bias[length]
        if skip:
            scores[..., length - skip:] = float("-inf")
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += length
    return torch.cat(out)


@pytest.mark.parametrize("seq_lens,unattended", [
    ([7, 30, 30, 1], [0, 0, 0, 0]),        # matmul path, one call for the equal lengths
    ([5, 200, 193], [0, 0, 0]),            # SDPA path with a float mask
    ([12, 12, 40], [0, 3, 5]),             # bias and a key mask together
])
def test_position_bias_matches_reference(seq_lens, unattended):
    torch.manual_seed(0)
    total, heads, dim = sum(seq_lens), 4, 8
    q, k, v = (torch.randn(total, heads, dim) for _ in range(3))
    bias = {n: torch.randn(heads, n, n) for n in set(seq_lens)}
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int32)
    got = packed_attention(q, k, v, seq_lens, cu, max(seq_lens), position_bias=bias,
                           num_unattended=unattended)
    expected = _reference(q, k, v, seq_lens, bias, unattended)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    plain = packed_attention(q, k, v, seq_lens, cu, max(seq_lens), num_unattended=unattended)
    assert not torch.allclose(plain, got, atol=1e-3)  # the bias changed the answer


def test_position_bias_refuses_causal_attention():
    q = torch.randn(3, 1, 4)
    with pytest.raises(ValueError, match="bidirectional attention only"):
        packed_attention(q, q, q, [3], torch.tensor([0, 3], dtype=torch.int32), 3,
                         causal=True, position_bias={3: torch.zeros(1, 3, 3)})
