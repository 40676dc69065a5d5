"""Copy checkpoint tensors into a module whose parameter names equal the checkpoint's."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def copy_named_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       what: str, missing_hint: str = "") -> set[str]:
    """Copy every tensor whose name is one of the module's parameters (shapes must agree);
    every parameter must be found. Returns the checkpoint names consumed."""
    params = dict(module.named_parameters())
    consumed = set()
    for name, tensor in weights:
        param = params.get(name)
        if param is None:
            continue
        if param.shape != tensor.shape:
            raise ValueError(f"{what}: checkpoint tensor {name!r} has shape "
                             f"{tuple(tensor.shape)}, the model expects {tuple(param.shape)}"
                             f"{missing_hint and ' (' + missing_hint + ')'}.")
        with torch.no_grad():
            param.copy_(tensor)
        consumed.add(name)
    missing = sorted(set(params) - consumed)
    if missing:
        raise ValueError(f"{what}: the checkpoint is missing weights for {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''}{missing_hint and '; ' + missing_hint}.")
    return consumed



def copy_renamed_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         renames: list, what: str, fused: str = "qkv_proj") -> set[str]:
    """Copy checkpoint tensors into `module` through a rename table of compiled
    (pattern, replacement, slot) rows: slot None copies the whole parameter, slot s copies
    into the s-th third of a fused q/k/v parameter (one whose name contains `fused`). Every
    parameter, and every third of a fused one, must be found. Returns the names consumed."""
    params = dict(module.named_parameters())
    consumed, loaded = set(), set()
    for name, tensor in weights:
        for pattern, repl, slot in renames:
            if not pattern.match(name):
                continue
            target = pattern.sub(repl, name)
            param = params[target]
            if slot is None:
                dest = param
            else:
                size = param.shape[0] // 3
                dest = param[slot * size:(slot + 1) * size]
            if dest.shape != tensor.shape:
                raise ValueError(f"{what}: checkpoint tensor {name!r} has shape "
                                 f"{tuple(tensor.shape)}, the model expects {tuple(dest.shape)}.")
            with torch.no_grad():
                dest.copy_(tensor)
            consumed.add(name)
            loaded.add(target if slot is None else f"{target}#{slot}")
            break
    expected = {n for n in params if fused not in n} | {
        f"{n}#{s}" for n in params if fused in n for s in range(3)}
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"{what}: the checkpoint is missing weights for {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''}.")
    return consumed
