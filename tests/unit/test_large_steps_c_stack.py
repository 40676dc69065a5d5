"""Steps above bert_cpu.MAX_TOKENS in the C layer stack (encoder_cpu.c's row-blocked GEMMs),
and the load-time choice between it and torch's layers (pooler/worker/layer_stack_check.py):
parity with the torch layers on both builds, independence from the thread count, which models
qualify, and the decision rule on fake timings."""
from __future__ import annotations

import logging

import pytest
import torch

from pooler.kernels import bert_cpu
from pooler.kernels.build import encoder_kernels
from pooler.layers.linear import Bf16Swap
from pooler.layers.quantization import quantize_linears
from pooler.models.bert import BertModel
from pooler.models.inputs import ModelInputs
from pooler.worker import layer_stack_check
from tests.unit.bert_stack import packed_inputs as _inputs
from tests.unit.bert_stack import tiny_bert
from tests.unit.bert_stack import torch_layers as _torch_layers

pytestmark = pytest.mark.skipif(
    encoder_kernels() is None,
    reason="CPU encoder kernels unavailable here (needs Linux x86-64 with AVX-512 or AVX2 and a C "
           "compiler; see pooler/kernels/build.py)")

# Row blocks (encoder_cpu.c's row_blocks) of uneven sizes: 197 tokens are 5 blocks of 39-40 rows
# on 1 thread, 6 of 32-33 on 2 or 3; 97 tokens 3 blocks of 32-33, or 4 of 24-25
LARGE_STEPS = [[60, 37, 100], [97], [50, 1, 46]]


def _c_stack(model: BertModel, inputs: ModelInputs) -> torch.Tensor | None:
    return bert_cpu.bert_layers_on_cpu(model, model.embed(inputs), inputs)


@pytest.mark.parametrize("lengths", LARGE_STEPS)
def test_large_steps_match_torch_layers_on_each_build(kernel_build, lengths):
    model = tiny_bert()
    inputs = _inputs(lengths)
    with torch.inference_mode():
        assert _c_stack(model, inputs) is None  # not chosen: torch's layers run it
        model.__dict__[bert_cpu.LARGE_STEPS] = True
        fused = _c_stack(model, inputs)
        assert fused is not None, f"{kernel_build.variant}: a {sum(lengths)}-token step should take C"
        torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5, atol=2e-5)


def test_a_step_of_many_short_sequences_matches_torch_layers():
    # 300 sequences: more than the stack's old fixed-size table of sequence starts held
    lengths = [1 + i % 3 for i in range(300)]
    model, inputs = tiny_bert(), _inputs(lengths)
    model.__dict__[bert_cpu.LARGE_STEPS] = True
    with torch.inference_mode():
        fused = _c_stack(model, inputs)
        assert fused is not None
        torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5, atol=2e-5)


def test_large_step_results_do_not_depend_on_threads():
    model, inputs = tiny_bert(), _inputs(LARGE_STEPS[0])
    model.__dict__[bert_cpu.LARGE_STEPS] = True
    previous = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                outs.append(_c_stack(model, inputs))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_only_fp32_stock_models_qualify():
    assert bert_cpu.large_steps_eligible(tiny_bert())
    assert not bert_cpu.large_steps_eligible(tiny_bert(heads=6))  # head size 8
    int8 = tiny_bert()
    quantize_linears(int8)  # keeps its own int8 GEMMs for large steps
    assert not bert_cpu.large_steps_eligible(int8)
    bf16 = tiny_bert()
    Bf16Swap(bf16).use(True)
    assert not bert_cpu.large_steps_eligible(bf16)


def _fake(c_seconds: float, torch_seconds: float, calls: list):
    def measure(c_stack, torch_layers):
        c_stack()  # each side really runs once: the decision's callables must work
        torch_layers()
        calls.append(1)
        return c_seconds, torch_seconds
    return measure


@pytest.mark.parametrize("c_ms,torch_ms,expect", [(80.0, 100.0, True), (104.0, 100.0, True),
                                                  (106.0, 100.0, False), (120.0, 100.0, False)])
def test_the_c_stack_goes_only_when_slower_beyond_the_margin(monkeypatch, c_ms, torch_ms,
                                                             expect):
    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    model, calls = tiny_bert(), []
    decision = layer_stack_check.choose_large_step_path(model, 128,
                                                        measure=_fake(c_ms, torch_ms, calls))
    assert calls == [1]
    assert decision.large_steps_in_c is expect
    assert model.__dict__[bert_cpu.LARGE_STEPS] is expect
    assert decision.timings == (c_ms, torch_ms)
    assert "C stack" in decision.reason and "torch layers" in decision.reason


@pytest.mark.parametrize("policy,expect", [("all", True), ("short", False), ("ALL", True)])
def test_the_environment_decides_without_timing(monkeypatch, policy, expect):
    monkeypatch.setenv(layer_stack_check.POLICY_ENV, policy)
    model, calls = tiny_bert(), []
    decision = layer_stack_check.choose_large_step_path(model, 128,
                                                        measure=_fake(1.0, 2.0, calls))
    assert calls == [] and decision.timings is None
    assert model.__dict__[bert_cpu.LARGE_STEPS] is expect


def test_a_bad_policy_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(layer_stack_check.POLICY_ENV, "sometimes")
    with pytest.raises(ValueError, match="POOLER_C_LAYER_STACK.*auto, all, short"):
        layer_stack_check.choose_large_step_path(tiny_bert(), 128, measure=_fake(1.0, 2.0, []))


def test_models_that_do_not_qualify_are_not_timed(monkeypatch):
    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    model, calls = tiny_bert(), []
    quantize_linears(model)
    decision = layer_stack_check.choose_large_step_path(model, 128,
                                                        measure=_fake(1.0, 2.0, calls))
    assert calls == [] and not decision.large_steps_in_c
    assert not model.__dict__.get(bert_cpu.LARGE_STEPS)


def test_one_timing_per_model_shape_in_a_process(monkeypatch, caplog):
    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    monkeypatch.setattr(layer_stack_check, "_DECISIONS", {})
    calls = []
    statistics = []

    def timed(c, t, rounds, statistic):
        statistics.append(statistic)
        return _fake(1.0, 2.0, calls)(c, t)
    monkeypatch.setattr(layer_stack_check, "interleaved_medians", timed)
    with caplog.at_level(logging.INFO, logger=layer_stack_check.__name__):
        first = layer_stack_check.choose_large_step_path(tiny_bert(seed=0), 128)
        second_model = tiny_bert(seed=1)  # other weights, same shape: the memo answers
        second = layer_stack_check.choose_large_step_path(second_model, 128)
        layer_stack_check.choose_large_step_path(tiny_bert(inter=96), 128)  # another shape
    assert len(calls) == 2 and statistics == [min, min]  # each side's fastest round
    assert first == second and second_model.__dict__[bert_cpu.LARGE_STEPS] is True
    assert sum("C layer stack" in r.getMessage() for r in caplog.records) == 3


def test_choosing_the_c_stack_frees_the_onednn_copies(monkeypatch):
    from pooler.layers import linear

    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    model = tiny_bert()
    inputs = _inputs(LARGE_STEPS[0])
    with torch.inference_mode():
        _torch_layers(model, inputs)  # packs every linear for oneDNN where it is available
    assert any(linear._PACKED in m.__dict__ for m in model.modules()) or not linear._HAS_ONEDNN
    layer_stack_check.choose_large_step_path(model, 128, measure=_fake(1.0, 2.0, []))
    assert not any(linear._PACKED in m.__dict__ for m in model.modules())


def _packed_layers(model: BertModel) -> list[int]:
    """Indices of the layers with a oneDNN-packed weight copy."""
    from pooler.layers import linear
    return [i for i, layer in enumerate(model.layers)
            if any(linear._PACKED in m.__dict__ for m in layer.modules())]


@pytest.mark.parametrize("c_wins", [True, False])
def test_the_check_times_a_few_layers_and_keeps_only_what_the_winner_reads(monkeypatch, c_wins):
    from pooler.layers import linear

    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    # the check's step of 4 x 128 rows on oneDNN's packed copies (on an AMX CPU it would take
    # MKL's GEMM on the weights as loaded, linear.MKL_MIN_ROWS, and make no copies to keep)
    monkeypatch.setattr(linear, "_mkl_kind", lambda: False)
    depth = layer_stack_check.CHECK_LAYERS + 2
    model, seen = tiny_bert(layers=depth), []

    def measure(c_stack, torch_layers):
        c_stack()
        torch_layers()
        seen.append(len(model.layers))
        assert bert_cpu._STATE in model.__dict__  # the C side packed the timed layers
        return (1.0, 2.0) if c_wins else (2.0, 1.0)

    decision = layer_stack_check.choose_large_step_path(model, 128, measure=measure)
    assert decision.large_steps_in_c is c_wins
    assert seen == [layer_stack_check.CHECK_LAYERS] and len(model.layers) == depth
    assert bert_cpu._STATE not in model.__dict__  # the partial C pack is gone either way
    if not linear._HAS_ONEDNN:
        assert _packed_layers(model) == []
    elif c_wins:
        assert _packed_layers(model) == []  # no step reads oneDNN's copies any more
    else:  # large steps read them: the timed layers' copies stay
        assert _packed_layers(model) == list(range(layer_stack_check.CHECK_LAYERS))
    # the first real step packs the whole stack and matches the torch layers
    inputs = _inputs([5, 9])
    with torch.inference_mode():
        fused = _c_stack(model, inputs)
        assert fused is not None
        torch.testing.assert_close(fused, _torch_layers(model, inputs), rtol=1e-5, atol=2e-5)
    assert len(model.__dict__[bert_cpu._STATE].key) == depth * bert_cpu._PER_LAYER


def test_the_model_gets_its_layers_back_when_the_timing_fails(monkeypatch):
    monkeypatch.delenv(layer_stack_check.POLICY_ENV, raising=False)
    model = tiny_bert(layers=layer_stack_check.CHECK_LAYERS + 1)
    layers = model.layers

    def measure(c_stack, torch_layers):
        raise RuntimeError("timer broke")

    with pytest.raises(RuntimeError, match="timer broke"):
        layer_stack_check.choose_large_step_path(model, 128, measure=measure)
    assert model.layers is layers and len(model.layers) == layer_stack_check.CHECK_LAYERS + 1
