"""Linear layers on the CPU fast path: oneDNN GEMM with the activation (or the residual add)
fused into it.

On CPU in fp32, `torch.ops.mkldnn._linear_pointwise` runs the GEMM and applies bias and GELU in
its epilogue, saving one pass over the [num_tokens, intermediate] activations; measured ~15%
faster than `linear` then `gelu` for MiniLM's FFN, and oneDNN's plain GEMM ~5-8% faster than
the MKL one `nn.Linear` calls on the Zen 4 it was timed on (docs/dev/journal.md). Anything
else (CUDA, half precision, int8 layers, other activations, autograd) takes the plain path.
Steps of MKL_MIN_ROWS rows or more on the CPU kinds in MKL_CPU_KINDS take MKL's GEMM on the
weight as loaded instead (see there).

bf16 on CPU (`Bf16Linear`, what `dtype="bfloat16"` swaps in on a CPU with AVX512_BF16 or
AMX-BF16): the same oneDNN call on a bf16 copy of the weight and bf16 activations, accumulating
in fp32 (VDPBF16PS / AMX tiles do twice the multiply-adds of an fp32 FMA per instruction).
Only the GEMM inputs are rounded: the residual stream, norms, softmax and pooling stay fp32,
which is what keeps cosine to fp32 >= 0.9999 (an all-bf16 model measured min 0.99988).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
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

# Plain fp32 layers over MKL_MIN_ROWS rows or more run MKL's GEMM on the weight as loaded
# (`F.linear`; the residual added inside the GEMM, `addmm` with beta 1; the activation in place
# after it) on the CPU kinds where that measured faster than oneDNN's packed GEMM with its fused
# epilogue: on the Sapphire Rapids VM (AMX kind) MKL took 0.88-0.96x oneDNN's time at 1,024 rows
# on NomicBert's shapes (1 thread), and whole 1,024-token steps 0.90-0.92x on NomicBert, 0.92x
# on Jina v3 and BGE-M3 (docs/dev/journal.md, "MKL for many rows"). Short steps keep oneDNN's
# packed copy (1.8x faster for a 12-token query), and so does every other CPU kind until it is
# measured: the oneDNN GEMM was the faster one on the Zen 4 where this module was first timed.
MKL_MIN_ROWS = 512
MKL_CPU_KINDS = ("AMX",)


@functools.lru_cache(maxsize=1)
def _mkl_kind() -> bool:
    from pooler.cpu_features import cpu_features
    return torch.backends.mkl.is_available() and cpu_features().kind() in MKL_CPU_KINDS


def _on_mkl(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether layer(x) takes MKL's GEMM (MKL_MIN_ROWS): a plain fp32 nn.Linear without an
    active adapter on a 2-D CPU input of that many rows, outside autograd."""
    return (x.dim() == 2 and x.shape[0] >= MKL_MIN_ROWS and type(layer) is nn.Linear
            and x.dtype == torch.float32 and layer.weight.dtype == torch.float32 and x.is_cpu
            and not (layer.weight.requires_grad and torch.is_grad_enabled())
            and not has_lora(layer) and _mkl_kind())

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


def _weight_key(weight: torch.Tensor) -> tuple:
    """What a packed copy of `weight` is valid for: where it lives, its version (copy_ bumps it
    on a reload in place; a view shares it) and its shape. A weight made under
    torch.inference_mode (a model built and loaded there) has no version counter: -1."""
    version = -1 if weight.is_inference() else weight._version
    return (weight.data_ptr(), version, weight.shape)


def _packed_for(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The layer's weight in oneDNN's layout when the fast path applies to x, else None
    (a Bf16Linear's weight is packed in bf16, and x may be fp32 or bf16)."""
    kind = type(layer)
    if not (_HAS_ONEDNN and x.is_cpu and x.dim() == 2):
        return None
    if kind is nn.Linear:
        if x.dtype != torch.float32:
            return None
    elif kind is not Bf16Linear or x.dtype not in _BF16_INPUTS or not BF16_ONEDNN:
        return None
    weight = layer.weight
    if weight.requires_grad and torch.is_grad_enabled():
        return None
    key = _weight_key(weight)
    cached = layer.__dict__.get(_PACKED)
    if cached is None or cached[0] != key:
        with torch.inference_mode():
            source = weight.detach()
            if kind is Bf16Linear:
                source = source.to(torch.bfloat16)
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(source))
        layer.__dict__[_PACKED] = cached
    return cached[1]


def drop_packed_weights(module: nn.Module) -> None:
    """Free the oneDNN-packed weight copies under `module` (a model whose steps all run the C
    layer stack no longer reads them; a later call that needs one packs it again)."""
    for child in module.modules():
        child.__dict__.pop(_PACKED, None)
        child.__dict__.pop(_PACKED_COLUMNS, None)


def linear_act(layer: nn.Module, x: torch.Tensor, act=None,
               postop: tuple[str, str] | None = _NO_POSTOP,
               keep_bf16: bool = False) -> torch.Tensor:
    """act(layer(x)) (act None: just layer(x)), as one oneDNN call when the fast path applies.
    `postop` must be what `onednn_postop` gave for `act` (None: no fused form).
    `keep_bf16`: the caller takes a bf16 result (it feeds another linear layer that
    `takes_bf16`, or attention, whose CPU kernels keep scores in fp32), so on the bf16 path it
    skips a round trip to fp32 (for the FFN that is a pass over [num_tokens, intermediate]),
    and an int8 layer stores its result in bf16."""
    if _on_mkl(layer, x):
        return _act_after(F.linear(x, layer.weight, layer.bias), act, postop)
    packed = None if postop is None else _packed_for(layer, x)
    if has_lora(layer):
        return _act_after(_with_lora(layer, x, packed), act, postop)
    if packed is None:
        # int8 layers: the activation in their C epilogue
        fused = getattr(layer, "fused_forward", None)
        if fused is not None and (act is None or postop in EPILOGUE_ACTS):
            y = fused(x, EPILOGUE_ACTS[postop] if act is not None else 0, bf16_out=keep_bf16)
            if y is not None:
                return y
        y = layer(_as_input_of(layer, x))
        return y if act is None else act(y)
    if type(layer) is nn.Linear:
        return _LINEAR(x, packed, layer.bias, postop[0], [], postop[1])
    y = _LINEAR(x.to(torch.bfloat16), packed, layer.bias, postop[0], [], postop[1])
    return y if keep_bf16 else y.to(x.dtype)


# Each layer asked for a slice of its outputs (linear_columns) keeps, per slice, (weight key,
# the slice's weight packed for oneDNN, its bias) in its __dict__ under _PACKED_COLUMNS.
_PACKED_COLUMNS = "_onednn_packed_columns"


def linear_columns(layer: nn.Module, x: torch.Tensor, start: int, stop: int,
                   keep_bf16: bool = False) -> torch.Tensor:
    """layer(x)[:, start:stop] computing only those output features where the layer is a plain
    fp32 nn.Linear (the pruned last layer's K/V over every token and its Q over the pooled
    rows: pooler/layers/row_attention.py); any other layer (int8, bf16, with LoRA) computes
    all of them and the slice is returned, in bf16 with `keep_bf16` as linear_act gives it.
    x: [rows, in] -> [rows, stop - start]."""
    if type(layer) is not nn.Linear or has_lora(layer) or x.dtype != layer.weight.dtype:
        return linear_act(layer, x, keep_bf16=keep_bf16)[:, start:stop]
    weight, bias = layer.weight[start:stop], layer.bias
    bias = None if bias is None else bias[start:stop]
    if not (_HAS_ONEDNN and x.is_cpu and x.dim() == 2 and x.dtype == torch.float32) or (
            weight.requires_grad and torch.is_grad_enabled()):
        return F.linear(x, weight, bias)
    key = _weight_key(layer.weight)
    slices = layer.__dict__.setdefault(_PACKED_COLUMNS, {})
    cached = slices.get((start, stop))
    if cached is None or cached[0] != key:
        with torch.inference_mode():
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous()),
                      None if bias is None else bias.detach().contiguous())
        slices[(start, stop)] = cached
    return _LINEAR(x, cached[1], cached[2], "none", [], "")


def takes_bf16(layer: nn.Module) -> bool:
    """Whether `layer` can be fed a bf16 input as it is (what a keep_bf16 producer may pass
    it): not an int8 layer, whose kernel quantizes from fp32."""
    return getattr(layer, "fused_forward", None) is None


def _with_lora(layer: nn.Module, x: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """The base output of a layer adapters target in this pass, with each active adapter's
    update on its rows, before any activation (so no fused epilogue). An fp32 layer on the
    oneDNN path adds them after its GEMM; any other layer (int8, bf16, plain) runs its own
    forward in fp32, whose hook adds them (a bf16 step with adapters is an fp32 step)."""
    if packed is not None and type(layer) is nn.Linear:
        return add_lora(layer, x, _LINEAR(x, packed, layer.bias, "none", [], ""))
    return layer(x.float() if x.dtype == torch.bfloat16 else x)


def _act_after(y: torch.Tensor, act, postop: tuple[str, str] | None) -> torch.Tensor:
    """act(y) (act None: y) after a GEMM that did not fuse it: in y's own memory where the
    post-op names an in-place form (act_in_place)."""
    if act is None:
        return y
    return act(y) if postop is None else act_in_place(y, act, postop)


def act_in_place(y: torch.Tensor, act, postop: tuple[str, str]) -> torch.Tensor:
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
    linear + add on the shared 2-core machine; see docs/dev/journal.md, issue 14 part 5).
    On the bf16 path the add reads the bf16 GEMM output and writes the fp32 residual stream.
    Many rows on MKL (MKL_MIN_ROWS): the residual is the GEMM's C (addmm, beta 1), then the
    bias where there is one."""
    fp32_add = residual.dtype == torch.float32 and residual.is_contiguous()
    if fp32_add and _on_mkl(layer, x) and residual.shape == (x.shape[0], layer.out_features):
        y = torch.addmm(residual, x, layer.weight.t())
        return y if layer.bias is None else y.add_(layer.bias)
    packed = _packed_for(layer, x)
    if has_lora(layer):
        if packed is not None and type(layer) is nn.Linear and fp32_add:
            return add_lora(layer, x, _LINEAR_BINARY(x, residual, packed, layer.bias, "add"))
        return _with_lora(layer, x, packed) + residual
    if packed is None:
        fused = getattr(layer, "fused_forward", None)  # int8 layers: the add in their C epilogue
        y = fused(x, 0, residual) if fused is not None else None
        return y if y is not None else layer(_as_input_of(layer, x)) + residual
    if type(layer) is Bf16Linear:
        return residual + _LINEAR(x.to(torch.bfloat16), packed, layer.bias, "none", [], "")
    if fp32_add:
        return _LINEAR_BINARY(x, residual, packed, layer.bias, "add")
    return layer(x) + residual


def linear_add_norm(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor,
                    norm: nn.Module) -> torch.Tensor:
    """norm(layer(x) + residual): a post-norm block's add-and-norm. An int8 layer applies an
    fp32 LayerNorm in its C epilogue (int8_gemm.c), on each block of rows while it is in cache:
    the torch LayerNorm was a pass of its own over [num_tokens, hidden], ~5% of an int8 MiniLM
    job on the bench corpus. Anything else adds (linear_add), then norms."""
    fused = getattr(layer, "fused_forward", None)
    if fused is not None and not has_lora(layer):
        y = fused(x, 0, residual, norm=norm)
        if y is not None:
            return y
    return norm(linear_add(layer, x, residual))


def _as_input_of(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x in a plain nn.Linear's dtype: a bf16 result kept by the layer before (keep_bf16)
    may reach an fp32 layer that the bf16 path left out."""
    weight = getattr(layer, "weight", None)
    if type(layer) is nn.Linear and weight is not None and x.dtype != weight.dtype:
        return x.to(weight.dtype)
    return x


_BF16_INPUTS = (torch.float32, torch.bfloat16)
# oneDNN runs bf16 GEMMs natively on AVX512_BF16 / AMX and emulates them on plain AVX-512;
# without AVX-512 it has no bf16 inner product, and Bf16Linear falls back to torch's own.
BF16_ONEDNN = _HAS_ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class Bf16Linear(nn.Linear):
    """nn.Linear computed in bf16 with fp32 accumulation on the CPU: the weight parameter
    stays fp32 (checkpoint loads and reloads are unchanged); a bf16 copy packed for oneDNN is
    made on first use and after a reload. Returns x's dtype."""

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Bf16Linear":
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias  # shared, not copied
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [tokens, in]
        packed = _packed_for(self, rows)
        if packed is None:  # no oneDNN bf16 here (or autograd): torch's bf16 GEMM
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            y = F.linear(rows.to(torch.bfloat16), self.weight.to(torch.bfloat16), bias)
        else:
            y = _LINEAR(rows.to(torch.bfloat16), packed, self.bias, "none", [], "")
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", bf16 compute"


class Bf16Swap:
    """Every nn.Linear under `module` (names ending in `skip` aside) paired with a Bf16Linear
    sharing its parameters; `use(True)` puts the bf16 twins in place, `use(False)` the
    originals. The same module objects are reused, so each keeps its packed weight across
    swaps (the load-time check swaps back and forth while timing)."""

    def __init__(self, module: nn.Module, skip: tuple[str, ...] = ()):
        self.slots = []  # (parent, attribute, fp32 layer, bf16 layer)
        for name, child in list(module.named_modules()):
            if type(child) is nn.Linear and name and not name.endswith(skip):
                parent_name, _, attr = name.rpartition(".")
                parent = module.get_submodule(parent_name) if parent_name else module
                self.slots.append((parent, attr, child, Bf16Linear.from_linear(child)))

    def use(self, bf16: bool) -> None:
        for parent, attr, fp32_layer, bf16_layer in self.slots:
            setattr(parent, attr, bf16_layer if bf16 else fp32_layer)
