"""Read checkpoint tensors from a model folder: safetensors or torch .bin, single or sharded.

The bottom of the stack: the loader, task heads and the fallback runner all read weights
through here, so none of them needs the others.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open

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
            for name, tensor in _read_safetensors(file, select):
                yield modern_name(name), tensor
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            for name, tensor in state.items():
                if select is None or select(name):
                    yield modern_name(name), tensor


# Bytes read through one safe_open mapping before it is closed and reopened (see
# _read_safetensors).
MAPPED_BYTES_PER_OPEN = 64 << 20


def _read_safetensors(file: Path, select: Callable[[str], bool] | None
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a safetensors file, in safe_open's order. safe_open maps the whole
    file and get_tensor copies out of the mapping, so every page read stays in this process's
    RSS (file-backed) until the file is closed: loading BGE-M3 (1.4 GB) in one open peaked at
    the weights twice. Reopening the file after every MAPPED_BYTES_PER_OPEN bytes bounds that
    to one window (reopening re-reads only the JSON header)."""
    try:
        with safe_open(str(file), framework="pt") as f:
            names = [n for n in f.keys() if select is None or select(n)]
        position = 0
        while position < len(names):
            with safe_open(str(file), framework="pt") as f:
                mapped = 0
                while position < len(names) and mapped < MAPPED_BYTES_PER_OPEN:
                    tensor = f.get_tensor(names[position])
                    mapped += tensor.numel() * tensor.element_size()
                    yield names[position], tensor
                    position += 1
    except SafetensorError as e:
        raise ValueError(f"{file} cannot be read as safetensors ({e}); the file is damaged "
                         f"or truncated: download it again.") from e


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
