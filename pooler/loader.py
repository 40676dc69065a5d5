"""Read checkpoint tensors from a model folder and build the native model."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn

from pooler.config import ModelConfig
from pooler.models import registry

logger = logging.getLogger(__name__)

_LEGACY_SUFFIXES = {".gamma": ".weight", ".beta": ".bias"}


def checkpoint_files(path: Path) -> list[Path]:
    """The weight files of a folder: safetensors (single or sharded) first, else torch .bin."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [path / s for s in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return [path / name]
    raise FileNotFoundError(f"No weights in {path}: expected model.safetensors, a sharded "
                            "safetensors index, or pytorch_model.bin.")


def iterate_weights(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) with legacy names (`LayerNorm.gamma/beta`) mapped to weight/bias."""
    for file in checkpoint_files(path):
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield _modern_name(name), f.get_tensor(name)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            for name, tensor in state.items():
                yield _modern_name(name), tensor


def _modern_name(name: str) -> str:
    for old, new in _LEGACY_SUFFIXES.items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


class PoolingModel(nn.Module):
    """A backbone that returns hidden states, and the pooler that turns them into outputs."""

    def __init__(self, backbone: nn.Module, pooler: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.pooler = pooler


def load_weights_into(model: PoolingModel, model_config: ModelConfig) -> None:
    """Load (or reload) the folder's checkpoint into `model` in place."""
    prefixes = getattr(model.backbone, "weight_prefixes", ())
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


def build_model(model_config: ModelConfig) -> PoolingModel:
    from pooler.pooling.dispatch import build_pooler

    spec = registry.get_arch_spec(model_config.architecture)
    backbone_cls = registry.load_backbone_class(spec)
    backbone = backbone_cls(model_config.hf_config)
    pooler = build_pooler(model_config, backbone)
    model = PoolingModel(backbone, pooler)
    load_weights_into(model, model_config)
    model = model.to(device=model_config.torch_device, dtype=model_config.torch_dtype)
    model.eval()
    model.requires_grad_(False)
    if model_config.quantization is not None:
        from pooler.layers.quantization import apply_quantization
        apply_quantization(model, model_config)
    return model
