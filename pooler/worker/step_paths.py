"""What computes each range of step sizes of a loaded model (`Engine.step_paths()`), for the
bench and the logs: the C layer stacks for short steps (pooler/kernels/bert_cpu.py in fp32,
bert_int8_cpu.py in int8) and the layers for the rest, as the model will actually choose them
(the same per-step checks, asked without a step)."""
from __future__ import annotations

import torch
from torch import nn

from pooler.kernels import bert_cpu, bert_int8_cpu
from pooler.kernels.build import encoder_kernels
from pooler.layers.quantization import Int8Linear
from pooler.models import bert
from pooler.models.bert import long_route_min_len
from pooler.worker.pooled_rows import pruning_enabled

ALL_STEPS = "all steps"


POOLED_ROWS = "steps pooling one row per text"


def step_paths(model: nn.Module | None, device: torch.device) -> dict[str, str]:
    """{range of step sizes: path}, in order of step size: e.g. {"1-64 tokens": "int8 C stack
    (avx512-vnni)", "65+ tokens": "int8 layers (avx512-vnni)"}; one "all steps" entry where
    every step takes the same path. A model that takes the pooled-rows route
    (pooler/worker/pooled_rows.py) adds a POOLED_ROWS entry: where its last layer runs on the
    rows the pooling reads."""
    backbone = getattr(model, "backbone", model)
    return {**_size_paths(model, backbone, device), **_pooled_rows(model, backbone)}


def _pooled_rows(model: nn.Module | None, backbone: nn.Module | None) -> dict[str, str]:
    pooler = getattr(model, "pooler", None)
    if not pruning_enabled(backbone) or not getattr(pooler, "reads_one_row", False):
        return {}
    if getattr(backbone, "short_steps_in_c", False) and bert_cpu.stack_config_ok(backbone):
        return {POOLED_ROWS: "last layer on those rows (where a C stack takes the step: from "
                             f"{bert.C_STACK_PRUNE_MIN_TOKENS + 1} tokens)"}
    return {POOLED_ROWS: "last layer on those rows"}


def _size_paths(model: nn.Module | None, backbone: nn.Module | None,
                device: torch.device) -> dict[str, str]:
    layers = _layers_path(model, backbone, device)
    if device.type != "cpu" or backbone is None or "layers" not in backbone._modules or \
            not getattr(backbone, "short_steps_in_c", False) or \
            not bert_cpu.stack_config_ok(backbone):
        return {ALL_STEPS: layers}
    fp32_stack = f"fp32 C stack ({encoder_kernels().variant})"
    long_docs = {}
    if backbone.__dict__.get(bert_cpu.LARGE_STEPS):  # fp32 steps of any size in C
        # but a step with a long document runs the layers (bert.long_route_takes_one)
        min_len = long_route_min_len(backbone)
        if min_len is not None:
            long_docs = {f"steps with a document of {min_len}+ tokens": layers}
        layers = fp32_stack
    int8 = bert_int8_cpu.int8_stack_path(backbone)  # the model's int8 layers or those it keeps
    if int8 is not None:
        limit, short = bert_int8_cpu.MAX_TOKENS, f"int8 C stack ({int8})"
    elif all(bert_cpu._layer_tensors(layer) is not None for layer in backbone.layers):
        limit, short = bert_cpu.MAX_TOKENS, fp32_stack
    else:
        return {ALL_STEPS: layers}
    if short == layers:
        return {ALL_STEPS: short, **long_docs}
    return {f"1-{limit} tokens": short, f"{limit + 1}+ tokens": layers, **long_docs}


def _layers_path(model, backbone, device: torch.device) -> str:
    """The path of a step run layer by layer (torch ops, the linears' own kernels)."""
    if backbone is not None:
        for module in backbone.modules():
            if isinstance(module, Int8Linear):
                return f"int8 layers ({module.path})"
    precision = str(getattr(model, "precision_path", "") or "")
    if "bf16" in precision:
        return f"bf16 layers ({precision})"
    dtype = next((p.dtype for p in model.parameters()), torch.float32) if model is not None \
        else torch.float32
    if device.type == "cpu" and dtype == torch.float32:
        return "fp32 layers (oneDNN)"
    return f"{str(dtype).removeprefix('torch.')} layers ({device.type})"
