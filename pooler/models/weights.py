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
