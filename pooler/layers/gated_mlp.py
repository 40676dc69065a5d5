"""The gated feed-forward block of Llama-family and Gemma decoders: down(act(gate(x)) * up(x))
(SwiGLU with SiLU, GeGLU with GELU). Parameter names equal the checkpoints'."""
from __future__ import annotations

import torch
from torch import nn

from pooler.layers.activations import get_activation


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, activation: str, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = get_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
