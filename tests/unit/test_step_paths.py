"""Engine.step_paths(): what each range of step sizes runs (pooler/worker/step_paths.py), for an
fp32 engine, an int8 engine whose short steps take the int8 C stack, one that kept fp32 copies
for the fp32 stack, and a model whose sizes no C stack takes."""
from __future__ import annotations

import pytest

from pooler.kernels import bert_cpu
from pooler.kernels.build import encoder_kernels
from pooler.kernels.int8_cpu import int8_path, runnable_paths
from pooler.layers.quantization import keep_fp32_short_steps
from pooler.models.bert import long_route_min_len
from pooler.models import bert
from pooler.worker.pooled_rows import PRUNE_ENV
from pooler.worker.step_paths import POOLED_ROWS, step_paths
from tests.models.tiny import add_st_pooling, save_tiny_bert

# these folders pool [CLS] (no sentence-transformers modules): their last layer may run on it
ROWS = {POOLED_ROWS: "last layer on those rows"}
STACK_ROWS = {POOLED_ROWS: "last layer on those rows (where a C stack takes the step: from "
                           f"{bert.C_STACK_PRUNE_MIN_TOKENS + 1} tokens)"}

needs_stack = pytest.mark.skipif(encoder_kernels() is None or not runnable_paths(),
                                 reason="no C layer stacks built on this CPU")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path):
    root = tmp_path_factory.mktemp("step-paths")
    # head size 16 takes the C stacks; tiny's default 8 does not
    return {"stack": save_tiny_bert(root / "stack", minilm_path, num_attention_heads=2),
            "no stack": save_tiny_bert(root / "plain", minilm_path)}


@needs_stack
def test_fp32_engine_short_steps_on_the_fp32_stack(folders):
    from pooler import Engine

    engine = Engine(str(folders["stack"]), device="cpu")
    stack = f"fp32 C stack ({encoder_kernels().variant})"
    if engine.core.model_runner.model.backbone.__dict__.get(bert_cpu.LARGE_STEPS):
        # the load check kept it for all, but a long document's step runs the layers
        long = long_route_min_len(engine.core.model_runner.model.backbone)
        assert engine.step_paths() == {
            "all steps": stack,
            f"steps with a document of {long}+ tokens": "fp32 layers (oneDNN)", **STACK_ROWS}
    else:
        assert engine.step_paths() == {"1-48 tokens": stack, "49+ tokens": "fp32 layers (oneDNN)",
                                       **STACK_ROWS}


@needs_stack
def test_int8_engine_short_steps_on_the_int8_stack_or_fp32_copies(folders):
    from pooler import Engine

    engine = Engine(str(folders["stack"]), device="cpu", quantization="int8",
                    precision_check="off")
    path = int8_path()
    assert engine.step_paths() == {"1-64 tokens": f"int8 C stack ({path})",
                                   "65+ tokens": f"int8 layers ({path})", **STACK_ROWS}
    # where the load check kept fp32 copies (fp32 won short steps): the fp32 stack up to 48
    runner = engine.core.model_runner
    fp32 = Engine(str(folders["stack"]), device="cpu").core.model_runner.model
    keep_fp32_short_steps(runner.model, fp32)
    assert engine.step_paths() == {"1-48 tokens": f"fp32 C stack ({encoder_kernels().variant})",
                                   "49+ tokens": f"int8 layers ({path})", **STACK_ROWS}


def test_sizes_no_stack_takes_one_path_for_all_steps(folders):
    from pooler import Engine

    engine = Engine(str(folders["no stack"]), device="cpu")
    assert engine.step_paths() == {"all steps": "fp32 layers (oneDNN)", **ROWS}


def test_no_pooled_rows_entry_for_mean_pooling_or_with_the_switch_off(folders, tmp_path,
                                                                        monkeypatch):
    import shutil

    from pooler import Engine

    mean = shutil.copytree(folders["no stack"], tmp_path / "mean")
    add_st_pooling(mean, "mean")
    assert Engine(str(mean), device="cpu").step_paths() == {"all steps": "fp32 layers (oneDNN)"}
    monkeypatch.setenv(PRUNE_ENV, "0")
    engine = Engine(str(folders["no stack"]), device="cpu")
    assert engine.step_paths() == {"all steps": "fp32 layers (oneDNN)"}


def test_without_a_model_one_entry():
    import torch

    assert list(step_paths(None, torch.device("cpu"))) == ["all steps"]
