"""Read checkpoint tensors from a model folder: safetensors or torch .bin, single or sharded.

The bottom of the stack: the loader, task heads and the fallback runner all read weights
through here, so none of them needs the others.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import safe_open

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


def iterate_weights(path: Path, select: Callable[[str], bool] | None = None
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) with legacy names (`LayerNorm.gamma/beta`) mapped to weight/bias;
    `select` (a test on the name as stored): only those tensors, the others never read from a
    safetensors file."""
    for file in checkpoint_files(path):
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if select is None or select(name):
                        yield modern_name(name), f.get_tensor(name)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            for name, tensor in state.items():
                if select is None or select(name):
                    yield modern_name(name), tensor


def modern_name(name: str) -> str:
    """A stored tensor name as iterate_weights yields it (`LayerNorm.gamma` -> `.weight`)."""
    for old, new in _LEGACY_SUFFIXES.items():
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
