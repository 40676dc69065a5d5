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
    """x: [num_tokens, heads, head_dim], rotated in fp32 and cast back (ModernBERT)."""
    xf = x.float()
    return (xf * cos.float() + _rotate_half(xf) * sin.float()).to(x.dtype)
