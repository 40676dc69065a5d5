"""LoRA at run time: each adapter's low-rank update applied to the rows it owns.

A step may mix requests for several adapters and for the base model. The model runner orders
the step's requests by adapter, so each adapter owns one contiguous run of rows (tokens in the
backbone, requests or tokens in the heads), and activates a `LoraRows` for the forward pass.
Every linear layer an adapter targets then gets, after its own output y = x W^T + b,

    y[rows] += (x[rows] @ A^T) @ (B^T * scaling)

per adapter: two small GEMMs on the adapter's slice, never a merged weight, so adapters and the
base share one packed forward (a fused q/k/v layer takes one x @ [A_q; A_k; A_v]^T and
adds each projection's B on its own third of the output). A head layer that the adapter saved whole (PEFT's
`modules_to_save`) has its output replaced on the adapter's rows instead.

Layers taking pooler's fast paths (pooler/layers/linear.py: oneDNN GEMMs with fused epilogues)
call `add_lora` themselves; every other targeted layer (plain nn.Linear calls, int8 layers,
head layers) gets a forward hook registered by `mark_target` doing the same. Tensors are kept
transposed ([in, rank] and [rank, out]) so both GEMMs read them contiguously.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

# Name under which a targeted layer keeps its key (its qualified name in the model) in its
# __dict__: an attribute lookup on the hot path, and no change to the module's state_dict.
_TARGET_KEY = "_lora_target_key"


@dataclass
class LowRank:
    """One adapter's update of one layer: t = x @ a_t, then each part adds
    t[:, r0:r1] @ b_t to output columns [col, col + b_t.shape[1]). One part for a plain layer;
    one per targeted projection of a fused q/k/v layer, so no block of zeros is multiplied.
    An embedding layer (`gather`) takes token ids, not vectors: t = a_t[ids], a_t holding a
    row per vocabulary entry."""
    a_t: torch.Tensor  # [in_features, total rank] ([vocab, total rank] when gather)
    parts: list[tuple[int, int, int, torch.Tensor]]  # (r0, r1, col, b_t [r1 - r0, cols])
    gather: bool = False

    def tensors(self) -> list[torch.Tensor]:
        return [self.a_t] + [b for *_, b in self.parts]


@dataclass
class Replacement:
    """A head layer the adapter saved whole (PEFT modules_to_save): its own parameters."""
    kind: str                   # "linear" | "layer_norm"
    weight: torch.Tensor        # [out, in] (linear) or [hidden] (layer norm)
    bias: torch.Tensor | None   # [out] / [hidden]
    eps: float = 1e-5           # layer norm only


@dataclass
class AdapterWeights:
    """Everything one resident adapter changes, keyed by the model's layer names."""
    name: str
    low_rank: dict[str, LowRank] = field(default_factory=dict)
    replaced: dict[str, Replacement] = field(default_factory=dict)

    def num_bytes(self) -> int:
        tensors = [t for w in self.low_rank.values() for t in w.tensors()]
        tensors += [t for r in self.replaced.values() for t in (r.weight, r.bias)
                    if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class LoraRows:
    """Which rows of the tensors flowing through the layers each adapter owns, for one pass.

    Adapter i owns rows [bounds[i], bounds[i + 1]); rows outside every range (the base
    model's requests) get no update. `num_rows` None: the ranges hold for any row count (a
    head run on one adapter's rows only, bounds = [0, None])."""
    adapters: list[AdapterWeights]  # [num_adapters] in row order
    bounds: list[int | None]        # [num_adapters + 1] row boundaries
    num_rows: int | None = None     # rows every targeted layer must see (tokens of the step)


_ACTIVE: ContextVar[LoraRows | None] = ContextVar("pooler_lora_rows", default=None)


@contextmanager
def lora_rows(rows: LoraRows | None):
    """Apply `rows`' adapters in every targeted layer run inside the block (None: none)."""
    token = _ACTIVE.set(rows)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def lora_active() -> bool:
    """Whether the running pass has adapters (fused paths that cannot add them step aside)."""
    return _ACTIVE.get() is not None


def has_lora(layer: nn.Module) -> bool:
    """Whether `layer` needs `add_lora` in the running pass: an adapter is active and the
    layer is one adapters may target."""
    return _TARGET_KEY in layer.__dict__ and _ACTIVE.get() is not None


def add_lora(layer: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y (the layer's base output for input x) with each active adapter's update on its rows,
    in place; returns y."""
    rows = _ACTIVE.get()
    key = layer.__dict__.get(_TARGET_KEY)
    if rows is None or key is None:
        return y
    # [rows, in]; an embedding's input is its token ids: [rows]
    x2 = x.reshape(-1, x.shape[-1]) if x.is_floating_point() else x.reshape(-1)
    y2 = y.view(-1, y.shape[-1])     # [rows, out]
    if rows.num_rows is not None and x2.shape[0] != rows.num_rows:
        raise RuntimeError(f"LoRA: layer {key} saw {x2.shape[0]} rows, the step has "
                           f"{rows.num_rows} tokens; this layer cannot take adapters.")
    for i, adapter in enumerate(rows.adapters):
        start, end = rows.bounds[i], rows.bounds[i + 1]
        low_rank = adapter.low_rank.get(key)
        if low_rank is not None:
            # y[rows] += (x[rows] @ A^T) @ B^T: addmm_ accumulates into the slice in place
            # (a column range of it for one projection of a fused q/k/v layer).
            t = low_rank.a_t[x2[start:end]] if low_rank.gather \
                else torch.mm(x2[start:end], low_rank.a_t)  # [rows, total rank]
            out = y2[start:end]
            for r0, r1, col, b_t in low_rank.parts:
                out[:, col:col + b_t.shape[1]].addmm_(t[:, r0:r1], b_t)
            continue
        replaced = adapter.replaced.get(key)
        if replaced is not None:
            y2[start:end] = _replaced_output(replaced, x2[start:end])
    return y


def _replaced_output(r: Replacement, x: torch.Tensor) -> torch.Tensor:
    if r.kind == "linear":
        return F.linear(x, r.weight, r.bias)
    return F.layer_norm(x, r.weight.shape, r.weight, r.bias, r.eps)


def _hook(layer: nn.Module, args, output):
    if _ACTIVE.get() is None:
        return None
    return add_lora(layer, args[0], output)


def mark_target(layer: nn.Module, key: str) -> None:
    """Let adapters reach `layer` under `key` (idempotent): plain calls go through a forward
    hook, the fast paths in linear.py check `has_lora` themselves."""
    if layer.__dict__.get(_TARGET_KEY) == key:
        return
    layer.__dict__[_TARGET_KEY] = key
    layer.register_forward_hook(_hook)
