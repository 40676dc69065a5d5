"""The int8 layer stack for short steps (int8_gemm.c's int8_bert_layers, the Python side in
pooler/kernels/bert_int8_cpu.py) against the same model's int8 torch layers (Int8Linear, one
kernel call per linear, which test_int8_kernels.py checks against an exact reference) and
against fp32, on seeded tiny BERTs and MPNets, on every int8 build this CPU runs.

The bar against the int8 torch layers is 1e-4: both run the same quantizer, GEMM, epilogue and
residual pass code on the same packed weights, so with the same fp32 attention kernel
(attention.h) they came out bit-equal; with torch's attention in the reference
(POOLER_CPU_KERNELS=0) float order flipped one activation code, 1.2e-5. A real divergence moves
outputs far more: the residual pass skipped moved them 6e-3 here. The torch reference is
run with q/k/v kept in fp32 (an int8 engine's torch layers round them to bf16 for the bf16
attention kernel, which the C stack does not). Against fp32 the bar is the int8 scheme's
(cosine >= 0.997 per token)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooler.kernels import bert_cpu, bert_int8_cpu
from pooler.kernels.build import encoder_kernels
from pooler.kernels.int8_cpu import runnable_paths
from pooler.layers.quantization import Int8Linear, record_input_ranges, smoothing_factors
from pooler.models import bert
from pooler.models.mpnet import MPNetModel
from tests.unit.bert_stack import packed_inputs as _inputs
from tests.unit.bert_stack import tiny_bert

PATHS = runnable_paths()
pytestmark = pytest.mark.skipif(not PATHS, reason="no int8 C build runs on this CPU")
STEPS = [[1], [12], [64], [5, 20, 9], [1, 1, 1]]


def _tiny_mpnet() -> MPNetModel:
    torch.manual_seed(0)
    model = MPNetModel({"vocab_size": 100, "hidden_size": 48, "num_hidden_layers": 2,
                        "num_attention_heads": 3, "intermediate_size": 80}).eval()
    with torch.no_grad():  # the bias table starts near zero: make it matter
        model.relative_attention_bias.weight.normal_(0, 1.0)
    return model


def _quantized(model, path: str, outlier_ratio: float | None = None, copy: bool = False):
    """model with every layer linear an Int8Linear on `path`, smoothed from one calibration
    forward; outlier_ratio: lowered so that the residual pass runs on many rows."""
    with torch.inference_mode():
        ranges = record_input_ranges(model, lambda: model(_inputs([30, 17, 12], seed=5)))
    for name, child in list(model.named_modules()):
        if isinstance(child, torch.nn.Linear) and ".layers." in f".{name}":
            parent, _, attr = name.rpartition(".")
            layer = Int8Linear.from_linear(child, path=path, short_step_copy=copy,
                                           smooth=smoothing_factors(ranges[name], child.weight))
            if outlier_ratio is not None:
                layer.outlier_ratio = outlier_ratio
            setattr(model.get_submodule(parent), attr, layer)
    return model


def _embed(model, inputs) -> torch.Tensor:  # [tokens, hidden]
    if isinstance(model, MPNetModel):
        return model.embed_norm(model.word_embeddings(inputs.input_ids)
                                + model.position_embeddings(inputs.positions + 2))
    return model.embed(inputs)


def _bias(model, inputs):
    return model.position_bias(inputs.seq_lens) if isinstance(model, MPNetModel) else None


def _torch_int8_layers(model, inputs, monkeypatch) -> torch.Tensor:
    """The int8 torch layers with q/k/v and attention in fp32 (see the module docstring)."""
    plain = bert.linear_act
    with monkeypatch.context() as m:
        m.setattr(bert, "linear_act", lambda *a, **k: plain(*a, **{**k, "keep_bf16": False}))
        x, bias = _embed(model, inputs), _bias(model, inputs)
        for layer in model.layers:
            layer.attention_bf16_products = False
            x = layer(x, inputs, bias)
    return x


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", ["bert", "mpnet"])
@pytest.mark.parametrize("outlier_ratio", [None, 2.5])
def test_matches_int8_torch_layers_and_fp32(path, family, outlier_ratio, monkeypatch):
    make = tiny_bert if family == "bert" else _tiny_mpnet
    fp32, model = make(), _quantized(make(), path, outlier_ratio)
    with torch.inference_mode():
        for lengths in STEPS:
            inputs = _inputs(lengths)
            fused = bert_int8_cpu.int8_bert_layers_on_cpu(model, _embed(model, inputs), inputs,
                                                          _bias(model, inputs))
            assert fused is not None, f"{lengths} should take the int8 C stack"
            torch.testing.assert_close(fused, _torch_int8_layers(model, inputs, monkeypatch),
                                       rtol=1e-4, atol=1e-4)
            reference = fp32(inputs)
            assert F.cosine_similarity(fused, reference).min() >= 0.997, lengths


@pytest.mark.parametrize("path", PATHS)
def test_unattended_suffix_matches_torch_layers(path, monkeypatch):
    model = _quantized(tiny_bert(), path)
    inputs = _inputs([9, 5, 7])
    inputs.num_unattended = [0, 3, 2]
    with torch.inference_mode():
        fused = bert_int8_cpu.int8_bert_layers_on_cpu(model, model.embed(inputs), inputs)
        torch.testing.assert_close(fused, _torch_int8_layers(model, inputs, monkeypatch),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", PATHS)
def test_results_do_not_depend_on_threads(path):
    model, inputs = _quantized(tiny_bert(), path, outlier_ratio=2.5), _inputs([40, 17])
    before = torch.get_num_threads()
    outs = []
    try:
        with torch.inference_mode():
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                outs.append(bert_int8_cpu.int8_bert_layers_on_cpu(
                    model, model.embed(inputs), inputs))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("path", PATHS)
def test_forward_takes_it_up_to_its_limit_and_reloads(path):
    model = _quantized(tiny_bert(), path)
    assert bert_int8_cpu.int8_stack_path(model) == path
    with torch.inference_mode():
        inputs = _inputs([bert_int8_cpu.MAX_TOKENS])
        expected = bert_int8_cpu.int8_bert_layers_on_cpu(model, model.embed(inputs), inputs)
        assert torch.equal(model(inputs), expected)
        too_long = _inputs([bert_int8_cpu.MAX_TOKENS + 1])
        assert bert_int8_cpu.int8_bert_layers_on_cpu(
            model, model.embed(too_long), too_long) is None
        # new weights copied in place (a reload) are repacked, not served stale
        layer = model.layers[0].up_proj
        layer.weight_q.copy_(-layer.weight_q)
        assert not torch.equal(model(inputs), expected)


@pytest.mark.skipif(encoder_kernels() is None, reason="the fp32 C stack is not built here")
def test_layers_that_kept_fp32_copies_take_the_fp32_stack():
    """The load-time check keeps fp32 copies only where fp32 won short steps: those run the
    fp32 stack, not the int8 one."""
    model = _quantized(tiny_bert(), PATHS[0], copy=True)
    assert bert_int8_cpu.int8_stack_path(model) is None
    inputs = _inputs([12])
    with torch.inference_mode():
        assert bert_int8_cpu.int8_bert_layers_on_cpu(model, model.embed(inputs), inputs) is None
        fp32_stack = bert_cpu.bert_layers_on_cpu(model, model.embed(inputs), inputs)
        assert torch.equal(model(inputs), fp32_stack)
