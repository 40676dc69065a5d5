"""Read checkpoint tensors from a model folder: safetensors or torch .bin, single or sharded.

The bottom of the stack: the loader, task heads and the fallback runner all read weights
through here, so none of them needs the others.
"""
from __future__ import annotations

import json
import struct
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
            for name, tensor in _read_safetensors(file, select):
                yield modern_name(name), tensor
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
            for name, tensor in state.items():
                if select is None or select(name):
                    yield modern_name(name), tensor


# safetensors dtype codes read without the library's mmap (see _read_safetensors)
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                       "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def _read_safetensors(file: Path, select: Callable[[str], bool] | None
                      ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of a safetensors file, each read into its own tensor with plain reads.
    safe_open maps the whole file and its get_tensor copies out of the mapping, so every page
    read stays in this process's RSS (file-backed) until the file is closed: loading BGE-M3
    (1.4 GB) that way peaked at the weights twice. Files with other dtypes (fp8, ...) go
    through safe_open."""
    with open(file, "rb", buffering=0) as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        header.pop("__metadata__", None)
        if any(info["dtype"] not in _SAFETENSORS_DTYPES for info in header.values()):
            with safe_open(str(file), framework="pt") as mapped:
                for name in mapped.keys():
                    if select is None or select(name):
                        yield name, mapped.get_tensor(name)
            return
        for name in sorted(header):  # safe_open's order
            if select is not None and not select(name):
                continue
            info = header[name]
            start, end = info["data_offsets"]
            tensor = torch.empty(info["shape"], dtype=_SAFETENSORS_DTYPES[info["dtype"]])
            if tensor.numel() * tensor.element_size() != end - start:
                raise ValueError(f"{file}: tensor {name!r} has {end - start} bytes for shape "
                                 f"{info['shape']} {info['dtype']}; the file is damaged.")
            f.seek(8 + header_size + start)
            _read_exactly(f, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()), file)
            yield name, tensor


def _read_exactly(f, buffer: memoryview, file: Path) -> None:
    done = 0
    while done < len(buffer):  # one read returns at most ~2 GB on Linux
        count = f.readinto(buffer[done:])
        if not count:
            raise ValueError(f"{file} ends early: the file is truncated.")
        done += count


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
