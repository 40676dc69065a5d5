"""Rotary position embeddings (RoPE), "rotate half" layout, as the decoders and ModernBERT use.

cos/sin are computed in fp32 and then cast to the activations' dtype, as transformers does, so
bf16 runs round the same way.
"""
from __future__ import annotations

import torch


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                   factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [num_tokens] -> cos, sin: [num_tokens, 1, head_dim] (halves repeated).
    `factor` is linear RoPE scaling (positions divided by it); 1.0 is plain RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                             device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * (inv_freq / factor)[None, :]  # [num_tokens, hd / 2]
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim], rotated in its own dtype (Llama, Gemma3)."""
    return x * cos + _rotate_half(x) * sin


def apply_rotary_fp32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, ..., head_dim] (heads, or q and k side by side: [num_tokens, 2, heads,
    head_dim]), rotated in fp32 and cast back (ModernBERT, the rotary encoders).

    x cos + rotate_half(x) sin as three passes into one fp32 buffer (x cos, then each half's
    product with sin added into the other half) where the textbook form made five ops and two
    [num_tokens, heads, head_dim] temporaries (cat, neg, mul, mul, add): rotary was 5.7% of a
    ModernBERT-base layer at 8k tokens, more than its norms (docs/dev/journal.md)."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.reshape(shape).float(), sin.reshape(shape).float()  # [num_tokens, 1.., hd]
    half = x.shape[-1] // 2
    xf = x.float()
    out = xf * cos
    out[..., :half].addcmul_(xf[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(xf[..., :half], sin[..., half:])
    return out if x.dtype == torch.float32 else out.to(x.dtype)
