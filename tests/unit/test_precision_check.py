"""Rule 2 wired into model load (pooler/worker/precision_check.py): int8 is timed against fp32 on
the engine's step shapes and kept only where it is not slower; fake timings decide here, and a
CPU without the int8 kernels (POOLER_CPU_FLAGS) shows the fallback end to end."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from pooler import cpu_features as cpu_features_module
from pooler.kernels.build import encoder_kernels
from pooler.layers.quantization import Int8Linear
from pooler.worker import precision_check
from tests.models.tiny import save_tiny_bert


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_path):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-int8") / "bert", minilm_path)


@pytest.fixture(scope="module")
def stack_bert(tmp_path_factory, minilm_path):
    """Head size 16: its short steps take the C layer stacks (tiny_bert's 8 does not)."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-int8-stack") / "bert", minilm_path,
                          num_attention_heads=2)


def _is_int8(backbone) -> bool:
    return any(isinstance(m, Int8Linear) for m in backbone.modules())


def _fake_timer(int8_seconds: float, fp32_seconds: float, seen: list | None = None):
    """An interleaved_medians stand-in: tells the two forwards apart by the backbone they run."""
    def one(fn):
        backbone, inputs = fn.args
        if seen is not None:
            seen.append(inputs.num_tokens)
        return int8_seconds if _is_int8(backbone) else fp32_seconds

    def timer(candidate, fp32, rounds=4, warmup=1):
        return one(candidate), one(fp32)
    return timer


def _runner(engine):
    return engine.core.model_runner


def test_slower_int8_falls_back_to_fp32_with_one_line(tiny_bert, monkeypatch, caplog):
    from pooler import Engine

    seen: list[int] = []
    monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(0.08, 0.005, seen))
    with caplog.at_level(logging.WARNING):
        engine = Engine(str(tiny_bert), device="cpu", quantization="int8",
                        max_num_batched_tokens=1024)
    runner = _runner(engine)
    assert runner.precision_decision.precision == "float32"
    assert not _is_int8(runner.model.backbone)
    # the shapes the engine runs: a single query, a mid short step and a full step of its
    # token budget (timed every time: short steps now take int8's own C stack)
    assert sorted(set(seen)) == [12, 48, 1024]
    [line] = [r.message for r in caplog.records if "slower than float32" in r.message]
    assert "float32 instead" in line and "8x128 tokens" in line
    assert "1x12 tokens" in line and "4x12 tokens" in line
    # and the fp32 it runs gives fp32's answers (reload keeps working too)
    fp32 = Engine(str(tiny_bert), device="cpu")
    a, b = (e.embed(["a short query"])[0].embedding for e in (engine, fp32))
    np.testing.assert_allclose(a, b, atol=1e-6)
    engine.reload_weights()
    np.testing.assert_allclose(engine.embed(["a short query"])[0].embedding, b, atol=1e-6)


def _size_timer(int8_short: float, int8_large: float):
    """Fake timings per step size: fp32 takes 5 ms for every shape, int8 the given seconds for
    steps of up to 48 tokens and for larger ones."""
    def timer(candidate, fp32, rounds=4, warmup=1):
        _, inputs = candidate.args
        return (int8_short if inputs.num_tokens <= 48 else int8_large), 0.005
    return timer


@pytest.mark.skipif(encoder_kernels() is None, reason="short steps run no C stack here")
def test_int8_slower_on_short_steps_keeps_int8_for_large_steps_only(stack_bert, monkeypatch,
                                                                    caplog):
    from pooler import Engine

    monkeypatch.setattr(precision_check, "interleaved_medians", _size_timer(0.05, 0.001))
    with caplog.at_level(logging.WARNING):
        engine = Engine(str(stack_bert), device="cpu", quantization="int8")
    runner = _runner(engine)
    decision = runner.precision_decision
    assert decision.precision == "int8"
    assert decision.ranges == (("short steps", False), ("large steps", True))
    # int8 layers for large steps, the fp32 C stack (fp32 copies) for short ones
    assert _is_int8(runner.model.backbone)
    assert precision_check.short_steps_stay_fp32(runner.model.backbone)
    [line] = [r.message for r in caplog.records if "per step size" in r.message]
    assert "short steps: float32" in line and "large steps: int8" in line
    fp32 = Engine(str(stack_bert), device="cpu")
    a, b = (e.embed(["a short query"])[0].embedding for e in (engine, fp32))
    np.testing.assert_allclose(a, b, atol=1e-6)  # the short query ran in fp32
    engine.reload_weights()  # the fp32 copies are refreshed too
    np.testing.assert_allclose(engine.embed(["a short query"])[0].embedding, b, atol=1e-6)
    # "refuse" never mixes precisions: losing one size is an error
    with pytest.raises(ValueError, match="slower than float32"):
        Engine(str(stack_bert), device="cpu", quantization="int8", precision_check="refuse")


@pytest.mark.skipif(encoder_kernels() is None, reason="short steps run no C stack here")
def test_int8_faster_on_short_steps_only_keeps_int8_layers_for_them(stack_bert, monkeypatch):
    """fp32 layers for large steps, its int8 twin's layers (on the int8 C stack) for short
    ones: what an AVX2-only CPU measures when oneDNN's fp32 GEMM beats the int8 layers."""
    from pooler import Engine
    from pooler.kernels.bert_int8_cpu import MAX_TOKENS, SHORT_STEP_LAYERS

    monkeypatch.setattr(precision_check, "interleaved_medians", _size_timer(0.001, 0.05))
    engine = Engine(str(stack_bert), device="cpu", quantization="int8")
    runner = _runner(engine)
    assert runner.precision_decision.ranges == (("short steps", True), ("large steps", False))
    assert not _is_int8(runner.model.backbone)  # the fp32 model serves
    assert len(runner.model.backbone.__dict__[SHORT_STEP_LAYERS]) == 2
    assert list(engine.step_paths())[0] == f"1-{MAX_TOKENS} tokens"
    assert "int8 C stack" in engine.step_paths()[f"1-{MAX_TOKENS} tokens"]
    int8 = Engine(str(stack_bert), device="cpu", quantization="int8", precision_check="off")
    fp32 = Engine(str(stack_bert), device="cpu")
    short, long_text = ["a short query"], ["word " * 100]
    np.testing.assert_allclose(engine.embed(short)[0].embedding,
                               int8.embed(short)[0].embedding, atol=1e-6)
    np.testing.assert_allclose(engine.embed(long_text)[0].embedding,
                               fp32.embed(long_text)[0].embedding, atol=1e-6)
    engine.reload_weights()  # the int8 short-step layers are quantized again, not dropped
    np.testing.assert_allclose(engine.embed(short)[0].embedding,
                               int8.embed(short)[0].embedding, atol=1e-6)


def test_faster_int8_is_kept(tiny_bert, monkeypatch, caplog):
    from pooler import Engine

    monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(0.002, 0.005))
    with caplog.at_level(logging.INFO, logger=precision_check.__name__):
        engine = Engine(str(tiny_bert), device="cpu", quantization="int8")
    assert _runner(engine).precision_decision.precision == "int8"
    # one info line, from the FASTER outcome
    [line] = [r.message for r in caplog.records if r.name == precision_check.__name__]
    assert line.startswith("int8 path ") and ": int8 faster than float32 on " in line
    assert _is_int8(_runner(engine).model.backbone)
    # int8 won short steps too: no fp32 copies kept for them
    assert not precision_check.short_steps_stay_fp32(_runner(engine).model.backbone)
    before = engine.embed(["reload keeps int8"])[0].embedding
    engine.reload_weights()
    np.testing.assert_allclose(engine.embed(["reload keeps int8"])[0].embedding, before,
                               atol=1e-6)


def test_refuse_raises_with_the_reason(tiny_bert, monkeypatch):
    from pooler import Engine

    monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(0.08, 0.005))
    with pytest.raises(ValueError, match="int8 is slower than float32.*--precision-check"):
        Engine(str(tiny_bert), device="cpu", quantization="int8", precision_check="refuse")


def test_off_runs_int8_without_timing(tiny_bert, monkeypatch):
    from pooler import Engine

    def never(*args, **kwargs):
        raise AssertionError("precision_check='off' must not time anything")

    monkeypatch.setattr(precision_check, "interleaved_medians", never)
    engine = Engine(str(tiny_bert), device="cpu", quantization="int8", precision_check="off")
    assert _runner(engine).precision_decision.precision == "int8"
    assert _is_int8(_runner(engine).model.backbone)


def test_bad_policy_names_the_field(tiny_bert):
    from pooler import Engine

    with pytest.raises(ValueError, match="precision_check must be one of"):
        Engine(str(tiny_bert), device="cpu", quantization="int8", precision_check="maybe")


def test_no_quantization_means_no_check(tiny_bert, monkeypatch):
    from pooler import Engine

    monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(1.0, 1.0, seen := []))
    engine = Engine(str(tiny_bert), device="cpu")
    assert _runner(engine).precision_decision is None and seen == []


def test_cpu_without_int8_kernels_times_the_portable_path(tiny_bert, monkeypatch, caplog):
    """On a CPU with no int8 build (no AVX2: an aarch64 or old x86 host, faked with
    POOLER_CPU_FLAGS) the layers take the torch path, and the gate's log names the flags seen."""
    from pooler import Engine

    monkeypatch.setenv(cpu_features_module.FLAGS_ENV, "sse4_2")
    cpu_features_module.cpu_features.cache_clear()
    try:
        monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(0.08, 0.005))
        with caplog.at_level(logging.WARNING):
            engine = Engine(str(tiny_bert), device="cpu", quantization="int8")
        assert _runner(engine).precision_decision.precision == "float32"
        [line] = [r.message for r in caplog.records if "slower than float32" in r.message]
        assert "no vector flags" in line or "sse4_2" in line
        monkeypatch.setattr(precision_check, "interleaved_medians", _fake_timer(0.001, 0.005))
        engine = Engine(str(tiny_bert), device="cpu", quantization="int8")
        paths = {m.path for m in _runner(engine).model.backbone.modules()
                 if isinstance(m, Int8Linear)}
        assert paths == {"torch"}
    finally:
        monkeypatch.undo()
        cpu_features_module.cpu_features.cache_clear()


def test_cli_flag_reaches_the_engine():
    import argparse

    from pooler.cli.common import add_engine_args, engine_kwargs

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--quantization", "int8", "--precision-check", "refuse"])
    assert engine_kwargs(args)["precision_check"] == "refuse"
    assert engine_kwargs(parser.parse_args([]))["precision_check"] == "fallback"
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision-check", "sometimes"])


def test_short_query_is_timed_where_int8_runs_short_steps_itself(tiny_bert, monkeypatch):
    """Without a C stack for short steps (no kernels built here, or sizes it does not take),
    short and large steps cannot take different precisions: one choice for every step, and
    slower at 1x12 alone sends the engine to fp32."""
    from pooler import Engine

    monkeypatch.setattr(precision_check, "stack_config_ok", lambda backbone: False)
    seen: list[int] = []

    def short_slower(candidate, fp32, rounds=4, warmup=1):
        tokens = len(candidate.args[1].input_ids)
        seen.append(tokens)
        return (0.004, 0.002) if tokens <= 12 else (0.05, 0.1)
    monkeypatch.setattr(precision_check, "interleaved_medians", short_slower)
    engine = Engine(str(tiny_bert), device="cpu", quantization="int8",
                    max_num_batched_tokens=1024)
    assert seen == [12, 48, 1024]
    assert _runner(engine).precision_decision.precision == "float32"
    assert _runner(engine).precision_decision.ranges == ()
