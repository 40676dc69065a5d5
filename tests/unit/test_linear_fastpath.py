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


@pytest.mark.parametrize("bias", [True, False])
def test_many_rows_take_mkl_with_the_same_result(bias, monkeypatch):
    """Steps of MKL_MIN_ROWS rows or more on an MKL kind of CPU (forced here, so any machine
    runs it) compute layer(x), act(layer(x)) and layer(x) + residual on the weight as loaded:
    no oneDNN packed copy is made for them, and the results equal the reference. Fewer rows
    keep the packed copy."""
    from pooler.layers import linear as linear_module
    monkeypatch.setattr(linear_module, "_mkl_kind", lambda: True)
    monkeypatch.setattr(linear_module, "MKL_MIN_ROWS", 64)
    torch.manual_seed(0)
    layer = nn.Linear(32, 48, bias=bias).requires_grad_(False)
    x, residual = torch.randn(64, 32), torch.randn(64, 48)
    with torch.inference_mode():
        torch.testing.assert_close(linear_act(layer, x, F.gelu, onednn_postop("gelu")),
                                   F.gelu(layer(x)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear_act(layer, x, F.silu, None), F.silu(layer(x)),
                                   rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(linear_module.linear_add(layer, x, residual),
                                   layer(x) + residual, rtol=1e-5, atol=1e-5)
        assert linear_module._PACKED not in layer.__dict__  # MKL on the weight as loaded
        short = linear_act(layer, x[:63])
        torch.testing.assert_close(short, layer(x[:63]), rtol=1e-5, atol=1e-5)
    if linear_module._HAS_ONEDNN:
        assert linear_module._PACKED in layer.__dict__  # fewer rows: oneDNN's packed copy


def test_mkl_rows_only_on_measured_cpu_kinds(monkeypatch):
    """The MKL route is gated by the CPU kinds it was measured on: elsewhere the same rows keep
    oneDNN's packed GEMM."""
    from pooler.cpu_features import cpu_features
    from pooler.layers import linear as linear_module
    layer, x = nn.Linear(8, 8).requires_grad_(False), torch.randn(linear_module.MKL_MIN_ROWS, 8)
    linear_module._mkl_kind.cache_clear()
    monkeypatch.setattr(linear_module, "MKL_CPU_KINDS", ())
    try:
        assert not linear_module._on_mkl(layer, x)
        linear_module._mkl_kind.cache_clear()
        monkeypatch.setattr(linear_module, "MKL_CPU_KINDS", (cpu_features().kind(),))
        assert linear_module._on_mkl(layer, x) == torch.backends.mkl.is_available()
        assert not linear_module._on_mkl(layer, x[:-1])  # too few rows
        assert not linear_module._on_mkl(layer, x.double())  # not fp32
    finally:
        linear_module._mkl_kind.cache_clear()
