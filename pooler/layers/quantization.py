"""Opt-in int8 linear layers for CPU (`quantization="int8"`).

Scheme (chosen by measurement, see docs/benchmarks.md):
- weights: symmetric int8 per output channel (one scale per row), computed once at load;
- activations: symmetric int8 per token (one scale per row of the input), computed on every
  call, so a token with large values does not crush the resolution of the others (per-tensor
  activation ranges, as torch/ONNX dynamic quantization use, are what lost accuracy);
- int8 x int8 -> int32 on VNNI through `torch._int_mm`, then one rescale and the bias in fp32.
The fused QKV projection stays in fp32 (`DEFAULT_KEEP_FP32`): attention scores amplify its
errors through the softmax. Over the 2,000-text benchmark corpus on all-MiniLM-L6-v2, cosine to
fp32 was min 0.9928 / mean 0.9969 with every linear in int8, and min 0.9970 / mean 0.9987 with
QKV in fp32 (FFN down projection in fp32 instead: min 0.9947). Embeddings, norms, attention and
poolers are never quantized.
"""
from __future__ import annotations

import torch
from torch import nn

# Linear-layer name suffixes left in fp32 by default.
DEFAULT_KEEP_FP32: tuple[str, ...] = ("qkv_proj",)


class Int8Linear(nn.Module):
    """y = x @ W^T + b with W int8 per output channel and x int8 per token."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().float()
        # [out] scale so that the row's largest |w| maps to 127.
        w_scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(weight / w_scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        # [in, out]: _int_mm wants the right operand as (K, N).
        self.register_buffer("weight_t", q.t().contiguous())
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()  # [tokens, in]
        # [tokens, 1] per-token scale; the clamp keeps all-zero rows finite.
        # (amax/amin: abs() and vector_norm(inf) measured 5-20x slower on CPU here.)
        a_scale = torch.maximum(x2.amax(dim=1, keepdim=True), x2.amin(dim=1, keepdim=True).neg_())
        a_scale = a_scale.clamp_(min=1e-12).div_(127.0)
        xq = x2.mul(a_scale.reciprocal()).round_().to(torch.int8)  # [tokens, in]
        acc = torch._int_mm(xq, self.weight_t)  # [tokens, out] int32
        y = acc.to(torch.float32).mul_(a_scale).mul_(self.w_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: nn.Module,
                     keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32) -> list[str]:
    """Replace every nn.Linear under `module` (except names ending in keep_fp32) in place;
    returns the names of the layers quantized."""
    targets = [(name, child) for name, child in module.named_modules()
               if isinstance(child, nn.Linear) and not name.endswith(tuple(keep_fp32))]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, Int8Linear.from_linear(linear))
    return [name for name, _ in targets]


def apply_quantization(model, model_config) -> None:
    """The loader's hook: quantize the backbone's linear layers when the config asks for it."""
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
    quantize_linears(model.backbone)
