"""Build the native model from a model folder: backbone, poolers, weights."""
from __future__ import annotations

import importlib
import logging

import torch
from torch import nn

from pooler import architectures
from pooler.architectures import ArchSpec
from pooler.checkpoint import iterate_weights, modern_name, strip_prefix
from pooler.config import ModelConfig
from pooler.cpu_features import cpu_features
from pooler.gliner import BACKBONE_PREFIX as GLINER_BACKBONE_PREFIX
from pooler.pooling.dispatch import build_pooler

logger = logging.getLogger(__name__)


def load_backbone_class(spec: ArchSpec) -> type[nn.Module]:
    """The family file is imported on first use: a process serving BERT never imports Llama."""
    module = importlib.import_module(f"pooler.models.{spec.family}")
    return getattr(module, spec.backbone)


class PoolingModel(nn.Module):
    """A backbone that returns hidden states, and the pooler that turns them into outputs."""

    def __init__(self, backbone: nn.Module, pooler: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.pooler = pooler
        # What computes the GEMMs, for logs and the bench ("float32", "onednn-bf16 (amx)", ...).
        self.precision_path = "float32"


def load_weights_into(model: PoolingModel, model_config: ModelConfig) -> None:
    """Load (or reload) the folder's checkpoint into `model` in place."""
    prefixes = getattr(model.backbone, "weight_prefixes", ())
    if model_config.gliner is not None:  # the backbone sits inside the GLiNER checkpoint
        prefixes = (GLINER_BACKBONE_PREFIX,)
    if getattr(model.backbone, "loads_weights_in_one_pass", False):
        consumed, rest = _stream_into_backbone(model.backbone, model_config, prefixes)
    else:
        weights = [(strip_prefix(n, prefixes), t) for n, t in iterate_weights(model_config.path)]
        consumed = model.backbone.load_weights(weights)
        rest = [(n, t) for n, t in weights if n not in consumed]
    consumed_by_pooler = model.pooler.load_weights(rest, model_config)
    for module in model.modules():
        if hasattr(module, "load_own_weights"):  # e.g. sentence-transformers Dense folders
            module.load_own_weights()
    unused = sorted(n for n, _ in rest if n not in consumed_by_pooler)
    if unused:
        logger.debug("Unused checkpoint tensors: %s", unused)


def _stream_into_backbone(backbone: nn.Module, model_config: ModelConfig,
                          prefixes: tuple[str, ...]) -> tuple[set[str], list]:
    """Load a backbone that reads its weights in one pass (the class sets
    `loads_weights_in_one_pass`) from a stream: each checkpoint tensor is freed once copied in,
    where a list held the whole checkpoint beside the model's parameters (load peak: twice the
    weights, 2.7 GB for BGE-M3's 1.4 GB). Then the tensors it left (the task heads'), read
    again from the folder. Returns (names consumed, the rest as (name, tensor))."""
    def stripped(stored: str) -> str:
        return strip_prefix(modern_name(stored), prefixes)

    consumed = backbone.load_weights(
        (strip_prefix(n, prefixes), t) for n, t in iterate_weights(model_config.path))
    rest = [(strip_prefix(n, prefixes), t) for n, t in iterate_weights(
        model_config.path, select=lambda stored: stripped(stored) not in consumed)]
    return consumed, rest


def build_model(model_config: ModelConfig, quantize: bool = True) -> PoolingModel:
    """The model with its weights; quantize=False leaves a quantization the config asks for to
    the caller (the model runner's load-time precision check)."""
    spec = architectures.get_arch_spec(model_config.architecture)
    backbone_cls = load_backbone_class(spec)
    backbone = backbone_cls(model_config.hf_config)
    pooler = build_pooler(model_config, backbone)
    model = PoolingModel(backbone, pooler)
    load_weights_into(model, model_config)
    # bf16 on the CPU keeps fp32 weights: only the GEMMs run in bf16 (worker/cpu_bf16.py).
    dtype = torch.float32 if model_config.cpu_bf16 else model_config.torch_dtype
    model = model.to(device=model_config.torch_device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    if dtype != torch.float32:
        model.precision_path = f"{model_config.dtype} ({model_config.torch_device.type})"
    if model_config.cpu_bf16:
        from pooler.worker.cpu_bf16 import bf16_path_name, choose_cpu_bf16
        decision = choose_cpu_bf16(model.backbone, model_config)
        model.precision_path = bf16_path_name(cpu_features()) if decision.use_candidate \
            else "float32 (bf16 fallback)"
    if quantize and model_config.quantization is not None:
        from pooler.layers.quantization import apply_quantization
        from pooler.worker.int8_calibration import calibration_forward
        apply_quantization(model, model_config, calibration_forward(model_config))
    return model
