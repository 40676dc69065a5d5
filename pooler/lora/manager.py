"""The adapters a model runner serves: which are known (name -> folder), which are resident
(at most `max_loras`, least recently used dropped first and read again from disk when next
asked for), and, for one step, which rows each adapter owns.

Every adapter is read and checked in full when it is added, so a bad one is refused then and
nothing already served changes. The scheduler never puts more than `max_loras` distinct
adapters in one step (engine/scheduler.py), so a step's adapters are always resident together.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from pooler.layers.lora import AdapterWeights, mark_target
from pooler.lora.adapter import AdapterError, read_adapter

logger = logging.getLogger(__name__)

DEFAULT_MAX_LORAS = 8
DEFAULT_MAX_LORA_RANK = 64


@dataclass
class StepLora:
    """Which adapter owns which rows of one step (requests ordered by adapter, base first).
    Adapter i owns tokens [token_bounds[i], token_bounds[i+1]) and requests
    [request_bounds[i], request_bounds[i+1]); rows before token_bounds[0] are the base's."""
    adapters: list[AdapterWeights]  # [num_adapters]
    token_bounds: list[int]         # [num_adapters + 1]
    request_bounds: list[int]       # [num_adapters + 1]
    num_tokens: int

    @property
    def touches_heads(self) -> bool:
        """Whether some adapter changes a pooler head layer (then heads run per adapter)."""
        return any(key.startswith("pooler.") for a in self.adapters
                   for key in (*a.low_rank, *a.replaced))


class LoraManager:
    def __init__(self, model: nn.Module, base_name: str, max_loras: int = DEFAULT_MAX_LORAS,
                 max_lora_rank: int = DEFAULT_MAX_LORA_RANK):
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}.")
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {max_lora_rank}.")
        self.model = model
        self.base_name = base_name
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.paths: dict[str, Path] = {}
        # Unloaded adapters' folders: requests submitted before the unload still run with them.
        self._retired: dict[str, Path] = {}
        self.resident: OrderedDict[str, AdapterWeights] = OrderedDict()
        # Adapters the model folder itself carries (task_adapters.py): always in memory,
        # never unloaded, outside max_loras.
        self.builtin: dict[str, AdapterWeights] = {}
        self.loads_from_disk = 0  # adapters read again after LRU eviction (observability)

    # ---- registry -----------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [*self.builtin, *self.paths]

    def add_builtin(self, weights: AdapterWeights) -> None:
        """Serve an adapter the model folder carries (already read) under its name."""
        for key in (*weights.low_rank, *weights.replaced):
            mark_target(self.model.get_submodule(key), key)
        self.builtin[weights.name] = weights

    def add(self, name: str, path: str | Path, replace: bool = False) -> None:
        """Register and load `name` (replace: swap out an adapter of that name); AdapterError
        (nothing changed) when it does not fit."""
        if not isinstance(name, str) or not name.strip():
            raise AdapterError("lora_name must be a non-empty string.")
        if name == self.base_name:
            raise AdapterError(f"lora_name {name!r} is the base model's name; pick another.")
        if name in self.builtin:
            raise AdapterError(f"{name!r} is one of the model's own task adapters; pick "
                               "another name.")
        if name in self.paths and not replace:
            raise AdapterError(f"a LoRA adapter named {name!r} is already loaded; unload it "
                               "first or pick another name.")
        weights = self._read(name, Path(path))
        self.paths[name] = Path(path)
        self._retired.pop(name, None)
        self._make_resident(weights, keep=())

    def remove(self, name: str) -> None:
        if name in self.builtin:
            raise AdapterError(f"{name!r} is one of the model's own task adapters; it stays "
                               "served.")
        if name not in self.paths:
            raise KeyError(name)
        self._retired[name] = self.paths.pop(name)
        self.resident.pop(name, None)

    # ---- one step -----------------------------------------------------------------------
    def weights(self, name: str, keep: tuple[str, ...] = ()) -> AdapterWeights:
        """The resident adapter (most recently used now), read from disk when it was dropped;
        adapters named in `keep` (the rest of the step) are never the ones dropped for it."""
        if name in self.builtin:
            return self.builtin[name]
        path = self.paths.get(name) or self._retired.get(name)
        if path is None:
            raise ValueError(f"LoRA adapter {name!r} is not loaded; loaded: {self.names}.")
        weights = self.resident.get(name)
        if weights is not None:
            self.resident.move_to_end(name)
            return weights
        weights = self._read(name, path)
        self.loads_from_disk += 1
        self._make_resident(weights, keep)
        return weights

    def step(self, names: list[str | None], seq_lens: list[int]) -> StepLora | None:
        """The step's StepLora for requests already ordered by `order_key` (None: base)."""
        if all(n is None for n in names):
            return None
        present = list(dict.fromkeys(n for n in names if n is not None))
        adapters, token_bounds, request_bounds = [], [], []
        offset = 0
        for i, (name, length) in enumerate(zip(names, seq_lens)):
            if name is not None and (not adapters or adapters[-1].name != name):
                adapters.append(self.weights(name, keep=tuple(present)))
                token_bounds.append(offset)
                request_bounds.append(i)
            offset += length
        token_bounds.append(offset)
        request_bounds.append(len(names))
        return StepLora(adapters, token_bounds, request_bounds, offset)

    def order_key(self, name: str | None) -> tuple[int, str]:
        """Sort key putting the base's requests first, then each adapter's together."""
        return (0, "") if name is None else (1, name)

    # ---- internals ----------------------------------------------------------------------
    def _read(self, name: str, path: Path) -> AdapterWeights:
        weights = read_adapter(name, path, self.model, self.base_name, self.max_lora_rank)
        for key in (*weights.low_rank, *weights.replaced):
            mark_target(self.model.get_submodule(key), key)
        return weights

    def _make_resident(self, weights: AdapterWeights, keep: tuple[str, ...]) -> None:
        self.resident[weights.name] = weights
        self.resident.move_to_end(weights.name)
        while len(self.resident) > self.max_loras:
            victim = next((n for n in self.resident if n not in keep and n != weights.name),
                          None)
            if victim is None:
                break
            del self.resident[victim]
            logger.debug("LoRA adapter %r dropped from memory (max_loras=%d)", victim,
                         self.max_loras)


__all__ = ["AdapterError", "LoraManager", "StepLora", "DEFAULT_MAX_LORAS",
           "DEFAULT_MAX_LORA_RANK"]
