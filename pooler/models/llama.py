"""Llama, Qwen2, Qwen3 and Mistral decoders on packed batches (causal attention per sequence).

They differ only in switches read from config.json: Qwen2 has biases on q/k/v, Qwen3
normalizes q and k per head (RMSNorm over head_dim) before the rotary embedding, Mistral may
limit attention to a causal sliding window (a query sees the `sliding_window` keys ending at
itself). Parameter names equal the checkpoint's (after the `model.` prefix), so loading is a
name lookup. The backbone returns the final-normed hidden states; heads (last-token pooling,
`score`) live in pooler/pooling.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from pooler.layers.attention import packed_attention
from pooler.layers.gated_mlp import GatedMLP
from pooler.layers.row_attention import attention_for_rows, scatter_rows
from pooler.layers.rotary import apply_rotary, rotary_cos_sin
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_named_weights


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    hidden_act: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None = None  # Mistral

    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        model_type = d.get("model_type", "llama")
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if isinstance(rope, dict) and "rope_type" not in rope and "type" not in rope and \
                all(isinstance(v, dict) for v in rope.values()) and rope:
            raise ValueError("Per-layer-type rope_parameters are not supported.")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"RoPE type {rope_type!r} is not implemented natively (only "
                             "'default'); run this model with runner='transformers'.")
        if d.get("use_sliding_window"):
            raise ValueError("Sliding-window attention (use_sliding_window=true) is not "
                             "implemented natively; run this model with runner='transformers'.")
        if d.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not implemented natively; run this "
                             "model with runner='transformers'.")
        attention_bias = bool(d.get("attention_bias", False))
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))),
            hidden_act=d.get("hidden_act", "silu"),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_window=(int(d["sliding_window"]) if model_type == "mistral"
                            and d.get("sliding_window") else None))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32, scale in the model dtype, as the reference does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    # True in int8 engines (quantization.py) and bf16 engines (cpu_bf16.py, through
    # bf16_engine_products): q/k/v come fp32 out of their linears either way, and long causal
    # or global sequences may then run SDPA in bf16 on AMX (attention_cpu.py, _bf16_long_routes;
    # 3.7-4.0x fp32 at 8k on a Qwen3 shape vs 1.3x, benchmarks/decoder_bf16_attention.py).
    attention_bf16_products = False
    bf16_engine_products = True

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim,
                                bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim,
                                bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        # transformers' causal window: key j is seen by query i when i - window < j <= i.
        self.half_window = None if cfg.sliding_window is None else cfg.sliding_window - 1

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = packed_attention(q, k, v, inputs.seq_lens, inputs.cu_seqlens, inputs.max_seqlen,
                               causal=True, half_window=self.half_window,
                               num_unattended=inputs.num_unattended,
                               bf16_products=self.attention_bf16_products)
        # out: [num_tokens, heads, head_dim]
        return self.o_proj(out.reshape(n, -1))

    def forward_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     inputs: ModelInputs, rows: torch.Tensor,
                     positions: list[int]) -> torch.Tensor:  # [num_seqs, hidden]
        """Attention of `rows` alone (one per sequence, at `positions` in it) against the keys
        and values of every token they see (the pooled-rows route: LlamaModel.forward)."""
        n, s = x.shape[0], rows.shape[0]
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        q = self.q_proj(x.index_select(0, rows)).view(s, self.num_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q, cos.index_select(0, rows), sin.index_select(0, rows))
        k = apply_rotary(k, cos, sin)
        out = attention_for_rows(q, k, v, inputs.seq_lens, self.head_dim ** -0.5,
                                 inputs.num_unattended, query_positions=positions, causal=True,
                                 half_window=self.half_window)
        return self.o_proj(out.reshape(s, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            cfg.mlp_bias)

    def forward(self, x, cos, sin, inputs: ModelInputs) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, inputs)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_rows(self, x, cos, sin, inputs: ModelInputs, rows: torch.Tensor,
                     positions: list[int]) -> torch.Tensor:  # [num_seqs, hidden]
        """This layer's output on `rows` alone (keys and values still from every token)."""
        x_rows = x.index_select(0, rows) + self.self_attn.forward_rows(
            self.input_layernorm(x), cos, sin, inputs, rows, positions)
        return x_rows + self.mlp(self.post_attention_layernorm(x_rows))


class LlamaModel(nn.Module):
    # LlamaForCausalLM / *ForSequenceClassification keep the decoder under `model.`.
    weight_prefixes = ("model.",)
    # a step whose pooling reads one row per sequence (the last token, or the last non-pad
    # one) runs the last layer on those rows alone (ModelInputs.output_rows)
    prunes_last_layer = True

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = LlamaConfig.from_dict(hf_config)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embed_tokens(inputs.input_ids)
        cos, sin = rotary_cos_sin(inputs.positions, self.config.head_dim, self.config.rope_theta,
                                  x.dtype)
        rows = inputs.last_layer_rows(self)
        if rows is None:
            for layer in self.layers:
                x = layer(x, cos, sin, inputs)
            return self.norm(x)
        for layer in self.layers[:-1]:
            x = layer(x, cos, sin, inputs)
        # each row's index in its own sequence: causal attention sees the keys up to it
        out = self.layers[-1].forward_rows(x, cos, sin, inputs, rows,
                                           inputs.output_row_positions())
        # only the pooled rows hold the model's output: the pooling reads no other
        return scatter_rows(x, rows, self.norm(out))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names (prefix stripped) equal our parameter names; returns those consumed."""
        return copy_named_weights(self, weights, "decoder backbone")
