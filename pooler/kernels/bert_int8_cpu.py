"""The BertLayer stack for a short step of an int8 model in one C call (int8_gemm.c's
int8_bert_layers): the fp32 stack's layer loop (pooler/kernels/bert_cpu.py) with every linear
on the int8 weights its Int8Linear layer already holds (the same packing, smoothing, column
sums, scales and outlier-row residual pass as the large-step path), in one OpenMP region.

Why: a short step is bound by streaming the weights (BERT-base: ~340 MB in fp32 per forward,
~85 MB in int8), and run as torch layers an int8 model also pays ~4 kernel calls and their
Python per linear. See docs/models/precision.md for what each step size runs.

Taken when all of these hold, else the caller tries the fp32 stack or the torch layers:
- the families bert_cpu.py takes (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet with its
  relative position bias), at most `MAX_TOKENS` tokens in all, fp32 on the CPU, no autograd;
- every one of the four linears of every layer (the model's own, or the int8 twin's layers an
  fp32 model keeps for short steps, `SHORT_STEP_LAYERS`) is an Int8Linear on a C build ("avx512-vnni"
  or "avx2", all the same) that kept no fp32 copy: layers that kept one
  (`short_step_copy`) are the load-time check's way of saying short steps run the fp32 stack
  (pooler/worker/precision_check.py);
- stock LayerNorms, a GELU (erf or tanh) or ReLU, hidden and head sizes multiples of 16.
The attention runs in fp32 (attention.h), over q/k/v kept in fp32.
"""
from __future__ import annotations

import ctypes

import torch
from torch import nn

from pooler.kernels.bert_cpu import _LINEARS, _NORMS, _kernel_activation, sequence_tables
from pooler.kernels.int8_cpu import load_build
from pooler.layers.quantization import Int8Linear

MAX_TOKENS = 64
# Set on an fp32 model (its __dict__) whose short steps run int8 while its large steps stay fp32
# (where the load-time check timed int8 faster only for short steps): the BertLayers of its
# int8 twin, in order, not registered as submodules (not in the state dict, not in modules()).
SHORT_STEP_LAYERS = "_int8_short_step_layers"
_STATE = "_int8_kernel_state"  # kept in the model's __dict__, like bert_cpu's packed weights


def _bert_layers(model: nn.Module):
    """The BertLayers a short step runs: the int8 twin's kept for short steps, or the model's."""
    return model.__dict__.get(SHORT_STEP_LAYERS) or model._modules["layers"]


def _int8_layers(model: nn.Module) -> list[list[Int8Linear]] | None:
    """The four Int8Linear layers of each BertLayer, or None when any layer does not qualify
    (see the module docstring)."""
    layers, path = [], None
    for layer in _bert_layers(model):
        modules = layer._modules
        linears = [modules.get(name) for name in _LINEARS]
        if any(type(m) is not Int8Linear or m.path == "torch" or
               m._buffers.get("fp32_weight") is not None for m in linears):
            return None
        if any(type(modules.get(name)) is not nn.LayerNorm for name in _NORMS):
            return None
        if path is None:
            path = linears[0].path
        if any(m.path != path for m in linears):
            return None
        layers.append(linears)
    return layers or None


def int8_stack_path(model: nn.Module) -> str | None:
    """The int8 build ("avx512-vnni", "avx2") whose C stack `model`'s short steps take, or None
    when they do not take it."""
    cfg = getattr(model, "config", None)
    if cfg is None or "layers" not in model._modules or _kernel_activation(cfg) is None:
        return None
    layers = _int8_layers(model)
    if layers is None or load_build(layers[0][0].path) is None:
        return None
    return layers[0][0].path


class _Int8Params:
    """The pointer table int8_bert_layers reads, and what keeps its targets alive."""

    def __init__(self, lib: ctypes.CDLL, model: nn.Module, layers: list[list[Int8Linear]]):
        self.keep, pointers, ratios = [], [], []
        for layer, linears in zip(_bert_layers(model), layers):
            for linear in linears:
                d = linear._derived(lib)  # packed once per weight version, shared with forward
                self.keep.append(d)
                pointers += [d["packed"].data_ptr(), d["colsum"].data_ptr(),
                             d["w_scale"].data_ptr(), d["bias"].data_ptr(),
                             d["inv_smooth"].data_ptr()]
                ratios.append(linear.outlier_ratio)
            for name in _NORMS:
                norm = layer._modules[name]
                w, b = (t.detach().float().contiguous() for t in (norm.weight, norm.bias))
                self.keep += [w, b]
                pointers += [w.data_ptr(), b.data_ptr()]
        assert len(pointers) == len(layers) * lib.int8_bert_params_per_layer()
        self.table = (ctypes.c_void_p * len(pointers))(*pointers)
        self.ratios = (ctypes.c_float * len(ratios))(*ratios)
        self.key = _key(model, layers)
        # the key's tensors, kept alive so that their ids stay unique while this state lives
        self.sources = [t for linears in layers for linear in linears
                        for t in linear._buffers.values() if t is not None] + \
            [p for layer in _bert_layers(model) for name in _NORMS
             for p in layer._modules[name]._parameters.values()]


def _key(model: nn.Module, layers: list[list[Int8Linear]]) -> list:
    """What the table was built from: each linear's buffers and their versions (a reload
    copies into them in place, and Int8Linear._derived repacks on the same key) and outlier
    ratio, and the norms' tensors and versions. Reads the dicts directly (nn.Module's
    __getattr__ is ~1 us a call)."""
    key = []
    for linears in layers:
        for linear in linears:
            buffers = linear._buffers
            key += [(id(t), t._version) if t is not None else None
                    for t in (buffers["weight_q"], buffers["w_scale"], buffers["bias"],
                              buffers["smooth"])]
            key.append(linear.outlier_ratio)
    for layer in _bert_layers(model):
        for name in _NORMS:
            params = layer._modules[name]._parameters
            key += [(id(params["weight"]), params["weight"]._version),
                    (id(params["bias"]), params["bias"]._version)]
    return key


def int8_stack_layers(model: nn.Module):
    """The BertLayers this stack runs for `model` (the int8 twin's an fp32 model keeps for
    short steps, else the model's own), in order."""
    return _bert_layers(model)


def int8_bert_layers_on_cpu(model: nn.Module, x: torch.Tensor, inputs,
                            position_bias: dict[int, torch.Tensor] | None = None,
                            num_layers: int | None = None) -> torch.Tensor | None:
    """model.layers applied to x [num_tokens, hidden] in one C call with int8 linears, or
    None when the step or the model does not qualify (see the module docstring); x is
    overwritten. position_bias: length -> [heads, L, L] fp32 (MPNet), as BertLayer takes it.
    num_layers: the first that many layers only (the pooled-rows route runs the last one
    itself, int8_stack_layers(model)[-1]: pooler/models/bert.py); all by default."""
    if not (x.shape[0] <= MAX_TOKENS and x.is_cpu and x.dtype == torch.float32
            and x.is_contiguous()) or torch.is_grad_enabled():
        return None
    seq_lens = inputs.seq_lens
    unattended = inputs.num_unattended or [0] * len(seq_lens)
    if any(u >= n for u, n in zip(unattended, seq_lens)):
        return None  # the torch path raises the error that names it
    cfg = model.config
    act = _kernel_activation(cfg)
    layers = _int8_layers(model) if act is not None else None
    lib = load_build(layers[0][0].path) if layers is not None else None
    if lib is None:
        return None
    state, key = model.__dict__.get(_STATE), _key(model, layers)
    if state is None or state.key != key:
        with torch.inference_mode():
            state = _Int8Params(lib, model, layers)
        model.__dict__[_STATE] = state
    m, h = x.shape
    heads, inter = cfg.num_attention_heads, cfg.intermediate_size
    threads = torch.get_num_threads()
    scratch = torch.empty(lib.int8_bert_scratch_bytes(m, h, inter, heads, threads),
                          dtype=torch.uint8)
    sequences = sequence_tables(seq_lens, unattended, position_bias)
    if sequences is None:
        return None
    count, starts, keys, bias = sequences
    stack = len(layers) if num_layers is None else num_layers
    lib.int8_bert_layers(x.data_ptr(), m, count, starts, keys, bias, h, heads, inter,
                         stack, state.table, state.ratios, cfg.layer_norm_eps, act,
                         scratch.data_ptr(), threads)
    return x
