"""Linear layers on the CPU fast path: oneDNN GEMM with the activation (or the residual add)
fused into it.

On CPU in fp32, `torch.ops.mkldnn._linear_pointwise` runs the GEMM and applies bias and GELU in
its epilogue, saving one pass over the [num_tokens, intermediate] activations; measured ~15%
faster than `linear` then `gelu` for MiniLM's FFN, and oneDNN's plain GEMM ~5-8% faster than
the MKL one `nn.Linear` calls on this CPU (docs/benchmarks.md). Anything else (CUDA,
half precision, int8 layers, other activations, autograd) takes the plain path.
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.kernels.int8_cpu import EPILOGUE_ACTS
from pooler.layers.lora import add_lora, has_lora

# config activation name -> (oneDNN post-op, algorithm)
_ONEDNN_POSTOPS = {
    "gelu": ("gelu", "none"), "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"), "relu": ("relu", ""),
}
_HAS_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                                "_linear_pointwise")


def onednn_postop(act_name: str) -> tuple[str, str] | None:
    """The fused post-op for a config activation name, or None when it has none."""
    return _ONEDNN_POSTOPS.get((act_name or "gelu").lower()) if _HAS_ONEDNN else None


_NO_POSTOP = ("none", "")

# Each fast-path layer keeps (weight version key, weight in oneDNN's blocked layout) in its
# __dict__ under _PACKED. Packing once instead of on every call measured 1.8x faster for a
# 12-token query (the reorder reads and writes the whole weight each call) and ~3% faster at 2k
# tokens. The key changes when the weight is reloaded in place (copy_ bumps its version), which
# repacks. An attribute lookup, not a WeakKeyDictionary: 24 lookups per MiniLM forward cost
# ~0.15 ms through the weak-keyed dict, a few us this way.
_PACKED = "_onednn_packed_weight"


if _HAS_ONEDNN:  # the op overloads, looked up once (each torch.ops.* lookup costs ~1 us)
    _LINEAR = torch.ops.mkldnn._linear_pointwise.default
    _LINEAR_BINARY = torch.ops.mkldnn._linear_pointwise.binary


def _packed_for(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The layer's weight in oneDNN's layout when the fast path applies to x, else None."""
    if not (_HAS_ONEDNN and type(layer) is nn.Linear and x.is_cpu
            and x.dtype == torch.float32 and x.dim() == 2):
        return None
    weight = layer.weight
    if weight.requires_grad and torch.is_grad_enabled():
        return None
    key = (weight.data_ptr(), weight._version, weight.shape)
    cached = layer.__dict__.get(_PACKED)
    if cached is None or cached[0] != key:
        with torch.inference_mode():
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        layer.__dict__[_PACKED] = cached
    return cached[1]


def linear_act(layer: nn.Module, x: torch.Tensor, act=None,
               postop: tuple[str, str] | None = _NO_POSTOP) -> torch.Tensor:
    """act(layer(x)) (act None: just layer(x)), as one oneDNN call when the fast path applies.
    `postop` must be what `onednn_postop` gave for `act` (None: no fused form)."""
    packed = None if postop is None else _packed_for(layer, x)
    if packed is not None:
        if has_lora(layer):  # the adapters' updates go in before the activation
            y = add_lora(layer, x, _LINEAR(x, packed, layer.bias, "none", [], ""))
            return y if act is None else _act_in_place(y, act, postop)
        return _LINEAR(x, packed, layer.bias, postop[0], [], postop[1])
    # int8 layers: the activation in their C epilogue (not with adapters: their updates go
    # in before the activation, through the forward hook of layer(x) below)
    fused = getattr(layer, "fused_forward", None)
    if fused is not None and not has_lora(layer) and (act is None or postop in EPILOGUE_ACTS):
        y = fused(x, EPILOGUE_ACTS[postop] if act is not None else 0)
        if y is not None:
            return y
    y = layer(x)  # a targeted layer's forward hook adds the adapters' updates
    return y if act is None else act(y)


def _act_in_place(y: torch.Tensor, act, postop: tuple[str, str]) -> torch.Tensor:
    """act(y), in y's own memory when the fused post-op names it: no second [tokens, inter]
    buffer to allocate and fault in."""
    if postop[0] == "gelu":
        return torch.ops.aten.gelu_(y, approximate=postop[1] or "none")
    if postop[0] == "relu":
        return y.relu_()
    return act(y)


def linear_add(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """layer(x) + residual, with the add in the GEMM's epilogue on the fast path: one pass and
    one allocation fewer per residual connection (a 12-token query measured within noise of
    linear + add on the shared 2-core machine; see docs/benchmarks.md, issue 14 part 5)."""
    packed = _packed_for(layer, x)
    if packed is not None and residual.dtype == torch.float32 and residual.is_contiguous():
        y = _LINEAR_BINARY(x, residual, packed, layer.bias, "add")
        return add_lora(layer, x, y) if has_lora(layer) else y
    fused = getattr(layer, "fused_forward", None)  # int8 layers: the add in their C epilogue
    y = fused(x, 0, residual) if fused is not None and not has_lora(layer) else None
    return y if y is not None else layer(x) + residual  # layer(x): its hook adds adapters
