"""The oneDNN linear fast path equals nn.Linear (+ activation) and follows in-place weight
reloads."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.linear import linear_act, onednn_postop


@pytest.mark.parametrize("act_name,act", [("gelu", F.gelu), ("relu", F.relu),
                                          ("gelu_new", lambda t: F.gelu(t, approximate="tanh"))])
def test_linear_act_matches_reference(act_name, act):
    torch.manual_seed(0)
    layer = nn.Linear(32, 48).requires_grad_(False)
    for rows in (1, 5, 300):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(linear_act(layer, x, act, onednn_postop(act_name)),
                                   act(layer(x)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear_act(layer, x), layer(x), rtol=1e-5, atol=1e-5)


def test_unknown_activation_takes_plain_path():
    assert onednn_postop("silu") is None
    layer = nn.Linear(8, 8).requires_grad_(False)
    x = torch.randn(3, 8)
    torch.testing.assert_close(linear_act(layer, x, F.silu, None), F.silu(layer(x)))


def test_weight_reload_in_place_is_seen():
    torch.manual_seed(0)
    layer = nn.Linear(16, 16).requires_grad_(False)
    x = torch.randn(4, 16)
    linear_act(layer, x)  # packs the current weight
    with torch.no_grad():
        layer.weight.copy_(torch.randn(16, 16))
    torch.testing.assert_close(linear_act(layer, x), layer(x), rtol=1e-5, atol=1e-5)
