"""The BertLayer stack for a step in one C call (encoder_cpu.c): always for a short step (one
short query, or a few), and for larger fp32 steps too where the load-time check timed it faster
than the torch layers (pooler/worker/layer_stack_check.py, the model's LARGE_STEPS flag).

Taken when all of these hold, else the model runs its torch layers:
- BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT and MPNet (its relative position bias added to
  the scores);
- the CPU kernels built here (pooler/kernels/build.py: Linux x86-64 with AVX-512 or AVX2, a C
  compiler, `POOLER_CPU_KERNELS` not 0);
- the step has at most `MAX_TOKENS` tokens in all (one short query, or a few packed together),
  or the model's LARGE_STEPS flag is set; fp32 on the CPU, no autograd (an unattended suffix,
  ColBERT's query expansion, is handled);
- hidden size and head size multiples of 16 (true of the BERT sizes in use: 384, 768, 1024
  with 32- or 64-wide heads);
- the layers are the stock ones (plain nn.Linear / nn.LayerNorm; int8 layers only where they
  keep their fp32 weights for this path, `short_step_copy`) with a GELU (erf or tanh) or ReLU
  activation. Bf16Linear layers (dtype="bfloat16" on the CPU) count as stock: they keep their
  fp32 weights, and a short step is faster in this fp32 kernel than in bf16 oneDNN GEMMs
  (pooler/worker/cpu_bf16.py).

Measured on MiniLM-L6, 12 tokens, 2 threads (docs/dev/journal.md, "A short step in one C
call"): the whole layer stack takes ~1.3 ms in C (its 24 GEMMs alone ~1.2 ms), where oneDNN's 24
GEMMs alone took ~2.9 ms and the torch layers ~60 more eager ops. For larger steps the GEMM
shares out (row block of at most 48 rows, panel) tasks, the same rows per thread; with that, MiniLM over the long-text mix ran 1.12x
faster than the torch layers on Zen 4's AVX-512 build and 1.25x with everything held to AVX2
(benchmarks/layer_stack_ab.py); before the row blocks, oneDNN won from about 64 tokens on.
Outputs agree with the torch path to ~3e-7 (tests/unit/test_bert_cpu_kernel.py,
tests/unit/test_large_steps_c_stack.py).

Memory: the packed copy of the layers' weights lives as long as the model (+42 MB for
MiniLM-L6, ~340 MB for BERT-base sizes, ~1.2 GB for XLM-R-large / BGE-M3), made at the first
step that takes this path; `drop_packed_stack` frees it (a later step packs it again).
"""
from __future__ import annotations

import ctypes
import mmap

import torch
from torch import nn

from pooler.kernels.build import encoder_kernels
from pooler.layers.linear import Bf16Linear

MAX_TOKENS = 48
# Set on a model (its __dict__) when steps of any size take this stack: fp32 models only, where
# the load-time check (pooler/worker/layer_stack_check.py) timed it faster than oneDNN.
LARGE_STEPS = "_cpu_kernel_large_steps"
# config hidden_act -> encoder_cpu.c epilogue
_ACTIVATIONS = {"gelu": 2, "gelu_python": 2, "gelu_new": 3, "gelu_pytorch_tanh": 3,
                "gelu_fast": 3, "relu": 4}
_STATE = "_cpu_kernel_state"  # kept in the model's __dict__, like linear.py's packed weights


_LINEARS = ("qkv_proj", "o_proj", "up_proj", "down_proj")
_STOCK_LINEARS = (nn.Linear, Bf16Linear)
_NORMS = ("attn_norm", "mlp_norm")
_PER_LAYER = 12  # tensors per layer (encoder_cpu.c's P_PER_LAYER), in its P_* order


def _layer_tensors(layer: nn.Module) -> list[torch.Tensor] | None:
    """The _PER_LAYER tensors encoder_cpu.c takes per layer, or None when a module is not
    stock. Reads the module dicts directly: nn.Module.__getattr__ made this ~0.3 ms per
    MiniLM call."""
    modules = layer._modules
    linears = [_fp32_weights(modules[name]) for name in _LINEARS]
    if any(w is None for w in linears) or any(
            type(modules[name]) is not nn.LayerNorm for name in _NORMS):
        return None
    qkv, o, up, down = linears
    norm1, norm2 = (modules[name]._parameters for name in _NORMS)
    tensors = [qkv["weight"], qkv["bias"], o["weight"], o["bias"], norm1["weight"],
               norm1["bias"], up["weight"], up["bias"], down["weight"], down["bias"],
               norm2["weight"], norm2["bias"]]
    return None if any(t is None for t in tensors) else tensors


def _fp32_weights(module: nn.Module) -> dict | None:
    """{"weight", "bias"} of a stock nn.Linear (or Bf16Linear: fp32 weights), or the fp32 copies an int8 layer keeps for
    this path (pooler/layers/quantization.py, short_step_copy); None otherwise."""
    if type(module) in _STOCK_LINEARS:
        return module._parameters
    buffers = module._buffers
    if buffers.get("fp32_weight") is not None:
        return {"weight": buffers["fp32_weight"], "bias": buffers.get("fp32_bias")}
    return None


_WEIGHT_SLOTS, _BIAS_SLOTS = (0, 2, 6, 8), (1, 3, 7, 9)  # per layer, in encoder_cpu.c's order
_HUGE_PAGE = 2 << 20


def _huge_page_floats(count: int) -> tuple[mmap.mmap, torch.Tensor]:
    """An fp32 buffer of `count` floats on memory the kernel may back with 2 MB pages. The
    weights stream through the TLB on every call: 4 KB pages cost 10% of the GEMM chain at 2
    threads, 15-20% at 1 (a C replica of MiniLM's 24 GEMMs). A no-op where THP is off."""
    size = count * 4 + _HUGE_PAGE  # room to start on a 2 MB boundary
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    offset = -address % _HUGE_PAGE
    return buf, torch.frombuffer(buf, dtype=torch.float32, count=count, offset=offset)


class _PackedLayers:
    """The layers' weights in encoder_cpu.c's layout, and the pointer table it reads."""

    def __init__(self, lib: ctypes.CDLL, tensors: list[torch.Tensor], key: list):
        self.key = key
        self.sources = tensors  # keeps the key's ids unique while this state lives
        self.keep = []  # owns every buffer the pointer table points into
        tensors = [t.detach().float().contiguous() for t in tensors]
        sizes = [-(-t.shape[0] // 32) * 32 * t.shape[1] if i % _PER_LAYER in _WEIGHT_SLOTS else 0
                 for i, t in enumerate(tensors)]
        self.mapping, weights = _huge_page_floats(sum(sizes))
        pointers, used = [], 0
        for i, t in enumerate(tensors):
            if sizes[i]:  # a weight [out, in]: 32-column panels, back to back in one buffer
                packed = weights[used:used + sizes[i]]
                used += sizes[i]
                lib.pack_linear_weight(t.data_ptr(), packed.data_ptr(), *t.shape)
                t = packed
            elif i % _PER_LAYER in _BIAS_SLOTS:  # padded to whole panels
                padded = torch.zeros(-(-t.numel() // 32) * 32)
                padded[:t.numel()] = t
                t = padded
            self.keep.append(t)
            pointers.append(t.data_ptr())
        self.table = (ctypes.c_void_p * len(pointers))(*pointers)


def _kernel_activation(cfg) -> int | None:
    """encoder_cpu.c's epilogue code for the config's activation, or None when the kernel
    cannot run this config: an activation it lacks, or hidden or head sizes that are not
    multiples of 16 (its vector loops step 16 floats, 8 on AVX2)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    if h % 16 or (h // heads) % 16:
        return None
    return _ACTIVATIONS.get((getattr(cfg, "hidden_act", None) or "gelu").lower())


def stack_config_ok(model: nn.Module) -> bool:
    """Whether `model`'s config (sizes, activation) lets its steps take a C layer stack here
    (this one, or bert_int8_cpu.py's) and the kernels are built: the layers are checked per
    step."""
    cfg = getattr(model, "config", None)
    return cfg is not None and _kernel_activation(cfg) is not None and \
        encoder_kernels() is not None


def drop_packed_stack(model: nn.Module) -> None:
    """Free `model`'s packed copy of its layers' weights (the load-time check packs one for the
    few layers it times; the first real step packs the whole stack again)."""
    model.__dict__.pop(_STATE, None)


def _weights_key(tensors: list[torch.Tensor]) -> list:
    # A reload copies into the same tensors (bumping _version) or swaps them (a new object;
    # the state keeps the old ones alive, so their ids are not reused).
    return [(id(t), t._version) for t in tensors]


def sequence_tables(seq_lens: list[int], unattended: list[int], position_bias):
    """(count, starts, keys, bias) as the C stacks take a step's packed sequences: starts
    (count + 1 offsets), attended keys per sequence, and per-sequence score-bias pointers (or
    None); None when a bias table is not contiguous fp32 (the caller runs its torch layers)."""
    count = len(seq_lens)
    starts, keys = (ctypes.c_int * (count + 1))(0), (ctypes.c_int * count)()
    for i, (n, u) in enumerate(zip(seq_lens, unattended)):
        starts[i + 1] = starts[i] + n
        keys[i] = n - u
    bias = None
    if position_bias is not None:
        tables = [position_bias[n] for n in seq_lens]
        if any(t.dtype != torch.float32 or not t.is_contiguous() for t in tables):
            return None
        bias = (ctypes.c_void_p * count)(*(t.data_ptr() for t in tables))
    return count, starts, keys, bias


def bert_layers_on_cpu(model: nn.Module, x: torch.Tensor, inputs,
                       position_bias: dict[int, torch.Tensor] | None = None,
                       num_layers: int | None = None) -> torch.Tensor | None:
    """model.layers applied to x [num_tokens, hidden] (the step's sequences packed back to
    back) in one C call, or None when the step or the model does not qualify (see the module
    docstring); x is overwritten. position_bias: length -> [heads, L, L] fp32 score bias shared
    by every layer (MPNet), as BertLayer takes it. num_layers: the first that many layers only
    (the pooled-rows route runs the last one itself: pooler/models/bert.py); all by default."""
    if not ((x.shape[0] <= MAX_TOKENS or model.__dict__.get(LARGE_STEPS)) and x.is_cpu
            and x.dtype == torch.float32 and x.is_contiguous()):
        return None
    seq_lens = inputs.seq_lens
    unattended = inputs.num_unattended or [0] * len(seq_lens)
    if any(u >= n for u, n in zip(unattended, seq_lens)):
        return None  # the torch path raises the error that names it
    cfg = model.config
    m, h = x.shape
    heads, inter = cfg.num_attention_heads, cfg.intermediate_size
    act = _kernel_activation(cfg)
    lib = encoder_kernels() if act is not None else None
    if lib is None:
        return None
    tensors = []
    for layer in model._modules["layers"]:
        layer_tensors = _layer_tensors(layer)
        if layer_tensors is None:
            return None
        tensors += layer_tensors
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    key = _weights_key(tensors)
    state = model.__dict__.get(_STATE)
    if state is None or state.key != key:
        with torch.inference_mode():
            state = _PackedLayers(lib, tensors, key)
        model.__dict__[_STATE] = state
    threads = torch.get_num_threads()
    scratch = torch.empty(lib.bert_scratch_floats(m, h, inter, heads, threads))
    sequences = sequence_tables(seq_lens, unattended, position_bias)
    if sequences is None:
        return None
    count, starts, keys, bias = sequences
    layers = len(model.layers) if num_layers is None else num_layers
    lib.bert_layers(x.data_ptr(), m, count, starts, keys, bias, h, heads, inter,
                    layers, state.table, cfg.layer_norm_eps, act, scratch.data_ptr(),
                    threads)
    return x


def large_steps_eligible(model: nn.Module) -> bool:
    """Whether steps of any size could take this stack for `model`, a backbone whose layers
    are BertLayers (the caller checks that: pooler/worker/layer_stack_check.py): plain fp32
    nn.Linear layers only (an int8 or bf16 model keeps its own GEMMs for large steps), stock
    norms, a known activation, vector-friendly sizes, kernels built."""
    layers = model._modules.get("layers")
    cfg = getattr(model, "config", None)
    if not layers or cfg is None or encoder_kernels() is None:
        return False
    if any(name not in layer._modules for layer in layers for name in _LINEARS + _NORMS):
        return False
    if _kernel_activation(cfg) is None:
        return False
    linears = [layer._modules.get(name) for layer in layers for name in _LINEARS]
    return all(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in linears) and \
        all(_layer_tensors(layer) is not None for layer in layers)
