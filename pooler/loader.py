"""Build the native model from a model folder: backbone, poolers, weights."""
from __future__ import annotations

import importlib
import logging

from torch import nn

from pooler import architectures
from pooler.architectures import ArchSpec
from pooler.checkpoint import iterate_weights, strip_prefix
from pooler.config import ModelConfig
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


def load_weights_into(model: PoolingModel, model_config: ModelConfig) -> None:
    """Load (or reload) the folder's checkpoint into `model` in place."""
    prefixes = getattr(model.backbone, "weight_prefixes", ())
    if model_config.gliner is not None:  # the backbone sits inside the GLiNER checkpoint
        prefixes = (GLINER_BACKBONE_PREFIX,)
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


def build_model(model_config: ModelConfig, quantize: bool = True) -> PoolingModel:
    """The model with its weights; quantize=False leaves a quantization the config asks for to
    the caller (the model runner's load-time precision check)."""
    spec = architectures.get_arch_spec(model_config.architecture)
    backbone_cls = load_backbone_class(spec)
    backbone = backbone_cls(model_config.hf_config)
    pooler = build_pooler(model_config, backbone)
    model = PoolingModel(backbone, pooler)
    load_weights_into(model, model_config)
    model = model.to(device=model_config.torch_device, dtype=model_config.torch_dtype)
    model.eval()
    model.requires_grad_(False)
    if quantize and model_config.quantization is not None:
        from pooler.layers.quantization import apply_quantization
        apply_quantization(model, model_config)
    return model
