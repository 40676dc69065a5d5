"""Gemma3 text decoders on packed batches: Gemma3TextModel (EmbeddingGemma), Gemma3ForCausalLM
and Gemma3TextForSequenceClassification.

What differs from Llama: the token embeddings are scaled by sqrt(hidden_size); RMSNorm scales
by (1 + weight); q and k are RMS-normed per head before the rotary embedding; each layer norms
before and after attention and before and after the MLP (GeGLU with tanh GELU); scores are
scaled by query_pre_attn_scalar ** -0.5; layers alternate between sliding-window layers (rotary
base `local`) and global ones (their own base, optionally linearly scaled), with grouped k/v
heads. With `use_bidirectional_attention` (EmbeddingGemma) no layer is causal and a sliding
layer sees sliding_window // 2 keys on each side, as transformers sets it up; the runner then
treats the model as an encoder (pooler/architectures.py: attention_type). Parameter names equal
the checkpoint's after the `model.` prefix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from pooler.layers.attention import packed_attention
from pooler.layers.gated_mlp import GatedMLP
from pooler.layers.rotary import apply_rotary, rotary_cos_sin
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_named_weights

GLOBAL, LOCAL = "full_attention", "sliding_attention"


@dataclass
class Gemma3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: list[str]
    sliding_window: int | None
    bidirectional: bool
    rope_theta: dict[str, float]        # layer type -> rotary base
    rope_linear_factor: dict[str, float]  # layer type -> linear scaling factor (1: none)
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    query_pre_attn_scalar: float = 256.0
    attention_bias: bool = False

    @property
    def half_window(self) -> int | None:
        """Keys a sliding layer sees on each side (bidirectional) or before the query (causal).
        transformers keeps |i - j| < sliding_window // 2 + 1 when bidirectional (the config
        rewrites the window so), and i - sliding_window < j <= i when causal."""
        if self.sliding_window is None:
            return None
        return self.sliding_window // 2 if self.bidirectional else self.sliding_window - 1

    @classmethod
    def from_dict(cls, d: dict) -> "Gemma3Config":
        if d.get("attn_logit_softcapping") is not None:
            raise ValueError("attn_logit_softcapping is not implemented natively for Gemma3; "
                             "run this model with runner='transformers'.")
        num_layers = d["num_hidden_layers"]
        layer_types = d.get("layer_types")
        if layer_types is None:  # older configs: every n-th layer is global
            every = d.get("sliding_window_pattern", 6)
            layer_types = [LOCAL if (i + 1) % every else GLOBAL for i in range(num_layers)]
        if len(layer_types) != num_layers or set(layer_types) - {GLOBAL, LOCAL}:
            raise ValueError(f"layer_types must list {num_layers} entries of {GLOBAL!r} or "
                             f"{LOCAL!r}, got {layer_types!r}.")
        heads = d["num_attention_heads"]
        theta, factor = _rope_settings(d)
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=num_layers,
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            layer_types=list(layer_types),
            sliding_window=int(d["sliding_window"]) if d.get("sliding_window") else None,
            bidirectional=bool(d.get("use_bidirectional_attention", False)),
            rope_theta=theta, rope_linear_factor=factor,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            hidden_activation=d.get("hidden_activation") or d.get("hidden_act")
            or "gelu_pytorch_tanh",
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
            attention_bias=bool(d.get("attention_bias", False)))


def _rope_settings(d: dict) -> tuple[dict[str, float], dict[str, float]]:
    """Rotary base and linear factor per layer type, from transformers 5's per-type
    `rope_parameters` or the older rope_theta / rope_local_base_freq / rope_scaling keys."""
    params = d.get("rope_parameters") or {}
    per_type = {kind: params.get(kind) for kind in (GLOBAL, LOCAL)}
    legacy = {GLOBAL: {"rope_theta": d.get("rope_theta", 1_000_000.0),
                       **(d.get("rope_scaling") or {})},
              LOCAL: {"rope_theta": d.get("rope_local_base_freq", 10_000.0)}}
    theta, factor = {}, {}
    for kind in (GLOBAL, LOCAL):
        rope = per_type[kind] if isinstance(per_type[kind], dict) else legacy[kind]
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise ValueError(f"RoPE type {rope_type!r} ({kind}) is not implemented natively "
                             "for Gemma3 (only 'default' and 'linear'); run this model with "
                             "runner='transformers'.")
        theta[kind] = float(rope.get("rope_theta") or legacy[kind]["rope_theta"])
        factor[kind] = float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0
    return theta, factor


class Gemma3RMSNorm(nn.Module):
    """RMSNorm in fp32 scaled by (1 + weight), then cast back (weights are stored around 0)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).type_as(x)


class Gemma3Attention(nn.Module):
    # True in int8 engines (quantization.py) and bf16 engines (cpu_bf16.py, through
    # bf16_engine_products): q/k/v come fp32 out of their linears either way, and long causal
    # or global sequences may then run SDPA in bf16 on AMX (attention_cpu.py, _bf16_long_routes;
    # 3.7-4.0x fp32 at 8k on a Qwen3 shape vs 1.3x, benchmarks/decoder_bf16_attention.py).
    attention_bf16_products = False
    bf16_engine_products = True

    def __init__(self, cfg: Gemma3Config, layer_type: str):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.causal = not cfg.bidirectional
        self.half_window = cfg.half_window if layer_type == LOCAL else None
        self.scale = cfg.query_pre_attn_scalar ** -0.5
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = Gemma3RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = Gemma3RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = packed_attention(q, k, v, inputs.seq_lens, inputs.cu_seqlens, inputs.max_seqlen,
                               causal=self.causal, half_window=self.half_window,
                               scale=self.scale, num_unattended=inputs.num_unattended,
                               bf16_products=self.attention_bf16_products)
        return self.o_proj(out.reshape(n, -1))  # out: [num_tokens, heads, head_dim]


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: Gemma3Config, index: int):
        super().__init__()
        self.layer_type = cfg.layer_types[index]
        eps = cfg.rms_norm_eps
        self.input_layernorm = Gemma3RMSNorm(cfg.hidden_size, eps)
        self.self_attn = Gemma3Attention(cfg, self.layer_type)
        self.post_attention_layernorm = Gemma3RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = Gemma3RMSNorm(cfg.hidden_size, eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_activation,
                            bias=False)  # GeGLU
        self.post_feedforward_layernorm = Gemma3RMSNorm(cfg.hidden_size, eps)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = x + self.post_attention_layernorm(
            self.self_attn(self.input_layernorm(x), rotary, inputs))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3TextModel(nn.Module):
    # Gemma3ForCausalLM / Gemma3TextForSequenceClassification keep it under `model.`.
    weight_prefixes = ("model.",)

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = Gemma3Config.from_dict(hf_config)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = Gemma3RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        cfg = self.config
        weight = self.embed_tokens.weight
        # The scale is rounded to the weight dtype first, as transformers does (bf16: 55.5).
        x = self.embed_tokens(inputs.input_ids) * torch.tensor(cfg.hidden_size ** 0.5,
                                                               dtype=weight.dtype)
        rotary = {kind: rotary_cos_sin(inputs.positions, cfg.head_dim, cfg.rope_theta[kind],
                                       x.dtype, cfg.rope_linear_factor[kind])
                  for kind in set(cfg.layer_types)}
        for layer in self.layers:
            x = layer(x, rotary[layer.layer_type], inputs)
        return self.norm(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names (prefix stripped) equal our parameter names; returns those consumed."""
        return copy_named_weights(self, weights, "Gemma3 backbone")
