"""Opt-in int8 linear layers for CPU (`quantization="int8"`).

Scheme (chosen by measurement, see docs/dev/journal.md):
- weights: symmetric int8 per output channel (one scale per row), computed once at load;
- activations: int8 per token (one scale per row of the input), computed on every call, so a
  token with large values does not crush the resolution of the others (per-tensor activation
  ranges, as torch/ONNX dynamic quantization use, are what lost accuracy);
- per-input-channel smoothing (SmoothQuant): x diag(1/s) and diag(s) W^T, with
  s_j = max|x_j|^0.5 / max|W[:, j]|^0.5 from one calibration forward at load
  (pooler/worker/int8_calibration.py); the kernel applies 1/s in its quantize step;
- tokens whose peak is over 20x their root mean square (in MiniLM, [CLS]/[SEP] rows at the
  FFN-down input: ~2% of rows; 10x at the AVX2 build's QKV input, `OUTLIER_RATIOS`) get a
  second int8 pass over their rounding residual, in the kernel (int8_gemm.c): those tokens' own
  range is the error smoothing cannot reach;
- int8 x int8 -> int32, then one rescale and the bias in fp32.
The product runs on the best path this CPU has (pooler/kernels/int8_cpu.py): pooler's C kernels
for AVX-512 VNNI and AVX2 (activations as unsigned codes with a per-token zero point; on AVX2
codes 0..128 with weights +-127 so that VPMADDUBSW cannot saturate), else the portable
`torch._int_mm` path (symmetric 8-bit activations). Whether any of them beats fp32 on this CPU
is checked at load (pooler/precision_gate.py, wired in pooler/worker/precision_check.py).

Where the error came from (benchmarks/int8_smoothing.py and the study in docs/dev/journal.md:
all-MiniLM-L6-v2, 400 texts of the bench corpus, one kind of linear in int8 at a time, min
cosine to fp32): the QKV and FFN-up inputs are post-LayerNorm hidden states whose few outlier
channels (up to 29 against a median of 1.7 in layer 3) set every token's range, so their
ACTIVATION codes are the loss (QKV activations alone 0.99785, its weights alone 0.99950, AVX2
codes); the FFN-down layer loses mostly through its WEIGHTS (weights alone 0.99876, its GELU
inputs alone 0.99958); the attention output projection is harmless (>= 0.9998). That is why the
AVX2 build's two bit splits measured the same minimum: each traded one of the two errors for the
other. Smoothing moves each outlier channel's range half into the weights, which cuts both, and
then full weight codes matter more than activation codes (AVX2: 0..128 / +-127).

QKV is int8 where the smoothed scheme measured >= 0.997 min cosine on the 2,000-text bench
corpus (the VNNI and AVX2 builds), and fp32 elsewhere (`SMOOTHED_KEEP_FP32`; without calibration inputs,
`DEFAULT_KEEP_FP32`). Embeddings, norms, attention and poolers are never quantized.
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.kernels.int8_cpu import WEIGHT_LEVELS, int8_kernels, int8_path, load_build

# Linear-layer name suffixes left in fp32 without smoothing (no calibration inputs): the fused
# QKV projections (BERT-style and rotary encoders' qkv_proj, ModernBERT's Wqkv).
DEFAULT_KEEP_FP32: tuple[str, ...] = ("qkv_proj", "Wqkv")
# ... and with smoothing, per int8 path: what the bench corpus measured (min cosine to fp32 over
# 2,000 texts: VNNI all int8 0.99848; AVX2 QKV fp32 0.99789, QKV int8 0.99701 with the default
# outlier ratio and 0.99776 with OUTLIER_RATIOS' 10 for QKV, 0.99747 after the rational erf in
# vector_math.h moved the worst text; the torch path was not measured with QKV int8).
SMOOTHED_KEEP_FP32: dict[str, tuple[str, ...]] = {"avx512-vnni": (), "avx2": (),
                                                  "torch": DEFAULT_KEEP_FP32}
# Per int8 path, linear-name suffix -> outlier ratio where it is not Int8Linear's 20: the AVX2
# build's 7-bit codes lose more on QKV's post-LayerNorm inputs, and a second pass for tokens
# over 10x their rms (3% of MiniLM's QKV rows, 0% at 20) won back most of what QKV in int8 cost
# (min cosine above; mean 0.998525 -> 0.998911, QKV fp32 0.999059), while the int8 QKV ran the
# forced AVX2 build at 1.31x fp32 against 1.24x with QKV fp32 (Zen 4, 1 thread, CPU time, four
# interleaved rounds, faster in each: docs/dev/journal.md). Lower ratios bought nothing more
# (6: 0.99735, 4: 0.99774), and 10 on the FFN-down input would send 38% of its rows through
# twice.
OUTLIER_RATIOS: dict[str, dict[str, float]] = {"avx2": {"qkv_proj": 10.0, "Wqkv": 10.0}}
# SmoothQuant's migration strength: 0.5 splits each outlier channel's range evenly between
# activations and weights (0.35 and 0.65 measured worse on the AVX2 build).
SMOOTHING_ALPHA = 0.5
_PANEL = 32  # int8_gemm.c's panel width: its per-column vectors are padded to it
_PACKED = "_int8_packed"  # derived packing, kept in __dict__ (not state_dict)


# Benchmarks turn the fused LayerNorm off here (the norm then runs after the kernel, in torch)
# to time it, or to compare with a build of int8_gemm.c that predates it.
FUSED_NORM = True


def fused_norm_args(norm: nn.Module, features: int) -> tuple[int, int, float] | None:
    """(weight pointer, bias pointer, eps) of a LayerNorm the int8 kernel can apply in its
    epilogue (int8_gemm.c's norm_rows): nn.LayerNorm over the last `features` dims with fp32
    contiguous CPU weight and bias, no autograd; else None (the caller runs the norm)."""
    if not (FUSED_NORM and type(norm) is nn.LayerNorm and norm.normalized_shape == (features,)):
        return None
    w, b = norm.weight, norm.bias
    if w is None or b is None or torch.is_grad_enabled() and (w.requires_grad or b.requires_grad):
        return None
    if not all(t.dtype == torch.float32 and t.is_cpu and t.is_contiguous() for t in (w, b)):
        return None
    return w.data_ptr(), b.data_ptr(), float(norm.eps)


class Int8Linear(nn.Module):
    """y = x @ W^T + b with W int8 per output channel and x int8 per token.

    path: "avx512-vnni", "avx2" or "torch"; None takes the best this process runs
    (`int8_cpu.int8_path()`)."""

    # A token whose largest |x / s| is over this many times its rms gets a second pass over
    # its rounding residual (int8_gemm.c); quantize_linears lowers it for some layers.
    outlier_ratio = 20.0

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 path: str | None = None, short_step_copy: bool = False,
                 smooth: torch.Tensor | None = None):
        super().__init__()
        if path is None:
            lib = int8_kernels()
            path = lib.variant if lib is not None else "torch"
        elif path != "torch" and int8_kernels(path) is None:  # unrunnable: ValueError
            path = "torch"  # no compiler: the portable path
        self.path = path
        levels = WEIGHT_LEVELS[path]
        weight = weight.detach().float()
        # smooth: [in] per-input-channel factors s (smoothing_factors): W diag(s) is quantized
        # here and x diag(1/s) on every call, so the product is the same and the outlier
        # channels' range is shared between the two sides.
        smoothed = weight if smooth is None else weight * smooth[None, :]
        # [out] scale so that the row's largest |w| maps to the path's largest code.
        w_scale = smoothed.abs().amax(dim=1).clamp(min=1e-12) / levels
        q = torch.round(smoothed / w_scale[:, None]).clamp(-levels, levels).to(torch.int8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight_q", q)  # [out, in] int8
        self.register_buffer("w_scale", w_scale)  # [out]
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("smooth", None if smooth is None else smooth.detach().float().clone())
        # The fp32 weights, kept only where short steps run the fp32 C layer stack
        # (pooler/kernels/bert_cpu.py): where the load-time check timed it faster than the
        # int8 C stack for short steps (pooler/worker/precision_check.py). Without them short
        # steps take the int8 stack (bert_int8_cpu.py). Not in the state dict.
        self.register_buffer("fp32_weight", None, persistent=False)
        self.register_buffer("fp32_bias", None, persistent=False)
        if short_step_copy:
            self.keep_fp32_copy(weight, bias)

    def keep_fp32_copy(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Keep fp32 weights (the fp32 layer's own, not copied) for the fp32 short-step stack."""
        self.fp32_weight = weight.detach().float()
        self.fp32_bias = None if bias is None else bias.detach().float()

    @classmethod
    def from_linear(cls, linear: nn.Linear, path: str | None = None,
                    short_step_copy: bool = False,
                    smooth: torch.Tensor | None = None) -> "Int8Linear":
        return cls(linear.weight, linear.bias, path, short_step_copy, smooth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float().contiguous()  # [tokens, in]
        lib = load_build(self.path) if self.path != "torch" and x2.is_cpu else None
        y = self._kernel(lib, x2) if lib is not None else self._torch(x2)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def _derived(self, lib) -> dict:
        """What the chosen path needs beyond the buffers, rebuilt when they change (a weight
        reload copies into them in place, bumping their version)."""
        key = (self.path, self.weight_q._version, self.w_scale._version,
               None if self.bias is None else self.bias._version,
               None if self.smooth is None else self.smooth._version)
        cached = self.__dict__.get(_PACKED)
        if cached is not None and cached["key"] == key:
            return cached
        n, k = self.weight_q.shape
        padded = -(-n // _PANEL) * _PANEL
        derived = {"key": key}
        if lib is None:  # torch._int_mm wants the right operand as (K, N)
            derived["weight_t"] = self.weight_q.t().contiguous()
        else:
            derived["packed"] = torch.empty(lib.int8_packed_bytes(n, k), dtype=torch.int8)
            derived["colsum"] = torch.zeros(padded, dtype=torch.int32)
            lib.pack_int8_weight(self.weight_q.contiguous().data_ptr(),
                                 derived["packed"].data_ptr(), derived["colsum"].data_ptr(),
                                 n, k)
            for name, source in (("w_scale", self.w_scale), ("bias", self.bias)):
                vector = torch.zeros(padded)
                if source is not None:
                    vector[:n] = source
                derived[name] = vector
            # [in] what the kernel multiplies x by before quantizing (ones: no smoothing)
            derived["inv_smooth"] = torch.ones(k) if self.smooth is None else \
                self.smooth.reciprocal().contiguous()
        self.__dict__[_PACKED] = derived
        return derived

    def fused_forward(self, x: torch.Tensor, act: int = 0,
                      residual: torch.Tensor | None = None,
                      bf16_out: bool = False,
                      norm: nn.LayerNorm | None = None) -> torch.Tensor | None:
        """act(x @ W^T + b) + residual in one pass over the output (act: int8_cpu.ACT_*), or
        None when this layer or these tensors do not take a C path (the caller then runs
        forward and the activation / add itself). x: [tokens, in]; residual: [tokens, out].
        bf16_out: the result rounded to bf16 as it is stored (for a consumer that rounds it
        anyway: the bf16 attention kernel), half the bytes written and read back.
        norm: a LayerNorm over the out features applied to that result in the same call (fp32
        out; see fused_norm_args for the ones taken, else None is returned)."""
        if self.path == "torch" or x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu:
            return None
        if residual is not None and not (residual.dtype == torch.float32 and
                                         residual.is_contiguous() and
                                         residual.shape == (x.shape[0], self.out_features)):
            return None
        norm_args = None
        if norm is not None:
            norm_args = fused_norm_args(norm, self.out_features)
            if norm_args is None or bf16_out:
                return None
        return self._kernel(load_build(self.path), x.contiguous(), act, residual, bf16_out,
                            norm_args)

    def _kernel(self, lib, x2: torch.Tensor, act: int = 0,
                residual: torch.Tensor | None = None, bf16_out: bool = False,
                norm_args: tuple[int, int, float] | None = None) -> torch.Tensor:
        d = self._derived(lib)
        m, k = x2.shape
        y = torch.empty(m, self.out_features,  # [tokens, out]
                        dtype=torch.bfloat16 if bf16_out else torch.float32)
        scratch = torch.empty(lib.int8_scratch_bytes(m, k), dtype=torch.uint8)
        ln_w, ln_b, ln_eps = norm_args or (None, None, 0.0)
        lib.int8_linear(x2.data_ptr(), d["inv_smooth"].data_ptr(), m, k, d["packed"].data_ptr(),
                        d["colsum"].data_ptr(), d["w_scale"].data_ptr(), d["bias"].data_ptr(),
                        None if residual is None else residual.data_ptr(), y.data_ptr(),
                        self.out_features, act, int(bf16_out), self.outlier_ratio,
                        ln_w, ln_b, ln_eps, scratch.data_ptr(), torch.get_num_threads())
        return y

    def _torch(self, x2: torch.Tensor) -> torch.Tensor:
        """The portable path: symmetric 8-bit activations through torch._int_mm."""
        if self.smooth is not None:
            x2 = x2 / self.smooth  # [tokens, in]
        # [tokens, 1] per-token scale; the clamp keeps all-zero rows finite.
        # (amax/amin: abs() and vector_norm(inf) measured 5-20x slower on CPU here.)
        a_scale = torch.maximum(x2.amax(dim=1, keepdim=True), x2.amin(dim=1, keepdim=True).neg_())
        a_scale = a_scale.clamp_(min=1e-12).div_(127.0)
        xq = x2.mul(a_scale.reciprocal()).round_().to(torch.int8)  # [tokens, in]
        acc = torch._int_mm(xq, self._derived(None)["weight_t"])  # [tokens, out] int32
        y = acc.to(torch.float32).mul_(a_scale).mul_(self.w_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 "
                f"({self.path})")


class _InputRangeRecorder(nn.Module):
    """Stands in for a linear layer during the calibration forward: records the largest |x|
    per input channel, then runs the layer. (A module, not a forward hook: the fused paths in
    pooler/layers/linear.py call a stock nn.Linear's kernels directly, bypassing hooks, and
    take this module's plain call instead.) Its weight and bias are the layer's, for models
    that also read them directly (DeBERTa's position projection)."""

    def __init__(self, linear: nn.Linear, ranges: dict[str, torch.Tensor], name: str):
        super().__init__()
        self.linear, self.ranges, self.name = linear, ranges, name

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()  # [in]
        previous = self.ranges.get(self.name)
        self.ranges[self.name] = seen if previous is None else torch.maximum(previous, seen)
        return self.linear(x)


def record_input_ranges(module: nn.Module, run) -> dict[str, torch.Tensor]:
    """name -> [in] largest |input| per channel of every nn.Linear under `module`, over what
    run() feeds it (the calibration forward). The layers are put back afterwards."""
    ranges: dict[str, torch.Tensor] = {}
    linears = [(name, child) for name, child in module.named_modules()
               if isinstance(child, nn.Linear)]

    def swap(make) -> None:
        for name, linear in linears:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, attr, make(name, linear))

    swap(lambda name, linear: _InputRangeRecorder(linear, ranges, name))
    try:
        run()
    finally:
        swap(lambda name, linear: linear)
    return ranges


def smoothing_factors(input_range: torch.Tensor, weight: torch.Tensor,
                      alpha: float = SMOOTHING_ALPHA) -> torch.Tensor:
    """[in] SmoothQuant's s_j = max|x_j|^alpha / max|W[:, j]|^(1 - alpha): after x_j / s_j and
    W[:, j] * s_j, both sides' channel j peaks at max|x_j|^alpha max|W_j|^(1-alpha)."""
    x_peak = input_range.float().clamp(min=1e-5)  # [in]; a channel never seen stays finite
    w_peak = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)  # [in]
    return (x_peak.pow(alpha) / w_peak.pow(1 - alpha)).clamp(min=1e-4, max=1e4)


def quantize_linears(module: nn.Module, keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32,
                     short_step_copy: bool = False,
                     input_ranges: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Replace every nn.Linear under `module` (except names ending in keep_fp32) in place;
    returns the names of the layers quantized. short_step_copy: keep each layer's fp32
    weights for the short-step C stack (see Int8Linear). input_ranges (record_input_ranges):
    smooth each layer found in it."""
    targets = [(name, child) for name, child in module.named_modules()
               if isinstance(child, nn.Linear) and not name.endswith(tuple(keep_fp32))]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        smooth = None if input_ranges is None or name not in input_ranges else \
            smoothing_factors(input_ranges[name], linear.weight)
        layer = Int8Linear.from_linear(linear, short_step_copy=short_step_copy, smooth=smooth)
        for suffix, ratio in OUTLIER_RATIOS.get(layer.path, {}).items():
            if name.endswith(suffix):
                layer.outlier_ratio = ratio
        setattr(parent, attr, layer)
    return [name for name, _ in targets]


def check_quantization(model_config) -> None:
    """The config's quantization can run at all (before any weights load or timing)."""
    if model_config.quantization is None:
        return
    if model_config.quantization != "int8":
        raise ValueError(f"quantization must be None or 'int8', got "
                         f"{model_config.quantization!r}.")
    if model_config.torch_device.type != "cpu":
        raise ValueError("quantization='int8' runs on CPU only; use dtype='float16' or "
                         "'bfloat16' on CUDA instead.")
    if model_config.torch_dtype != torch.float32:
        raise ValueError("quantization='int8' needs dtype='float32' (activations are "
                         "quantized from fp32).")


def keep_fp32_short_steps(int8_model: nn.Module, fp32_model: nn.Module) -> None:
    """Give each Int8Linear of `int8_model` the fp32 weights of the same-named layer of
    `fp32_model` (its unquantized twin), so that short steps run the fp32 C layer stack."""
    fp32_linears = dict(fp32_model.named_modules())
    for name, module in int8_model.named_modules():
        if isinstance(module, Int8Linear):
            twin = fp32_linears[name]
            module.keep_fp32_copy(twin.weight, twin.bias)


def keep_fp32_for(path: str, smoothed: bool) -> tuple[str, ...]:
    """The layers left in fp32 on this int8 path (see SMOOTHED_KEEP_FP32)."""
    return SMOOTHED_KEEP_FP32.get(path, DEFAULT_KEEP_FP32) if smoothed else DEFAULT_KEEP_FP32


def apply_quantization(model, model_config, calibrate=None) -> None:
    """The loader's hook: quantize the backbone's linear layers when the config asks for it.
    calibrate(backbone): the load-time calibration forward (pooler/worker/int8_calibration.py)
    the smoothing factors come from; None quantizes unsmoothed, with QKV in fp32."""
    if model_config.quantization is None:
        return
    check_quantization(model_config)
    backbone = model.backbone
    ranges = None if calibrate is None else \
        record_input_ranges(backbone, lambda: calibrate(backbone))
    # A family whose code reads a layer's fp32 weight directly keeps that layer in fp32
    # (DeBERTa projects its relative positions with the QKV weight).
    keep = keep_fp32_for(int8_path(), bool(ranges)) + \
        tuple(getattr(backbone, "int8_keep_fp32", ()))
    # No fp32 copies: short steps of the BERT families take the int8 C stack
    # (bert_int8_cpu.py), unless the load-time check keeps them (keep_fp32_short_steps).
    quantize_linears(backbone, keep, input_ranges=ranges or None)
    # Layers that can let attention round its inputs to bf16 do so: int8's error dwarfs it
    for module in backbone.modules():
        if hasattr(module, "attention_bf16_products"):
            module.attention_bf16_products = True
