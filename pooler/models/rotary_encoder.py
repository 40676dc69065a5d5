"""One rotary BERT-style encoder for NomicBert, GTE, Jina v3 and EuroBERT, on packed batches.

transformers derives GTE and NomicBert from Jina v3 in its modular files, and EuroBERT is a
bidirectional Llama; they differ in a few switches, kept as options of one block:
- norm placement: post-norm (BERT: residual, then LayerNorm; embeddings normed) or pre-norm
  (Llama: RMSNorm before attention and MLP, a final norm, raw embeddings);
- MLP: gated (act(gate) * up, then down) or plain (fc1 -> act -> fc2), each with its biases;
- attention biases, grouped-query heads, the rotary base and its scaling (linear, NTK).
q/k/v are one fused projection and the MLP's gate and up another (fewer, larger GEMMs on CPU);
the per-family loaders (pooler/models/rotary_weights.py) fill their slices from the
checkpoint's separate or fused tensors. Heads live in pooler/pooling, never here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from pooler.layers.activations import get_activation
from pooler.layers.attention import packed_attention
from pooler.kernels.attention_cpu import bf16_kernel_takes
from pooler.layers.linear import (act_in_place, linear_act, linear_add, linear_add_norm,
                                  linear_columns, onednn_postop)
from pooler.layers.lora import has_lora
from pooler.layers.row_attention import attention_for_rows, scatter_rows
from pooler.layers.rotary import apply_rotary_fp32, rotary_cos_sin
from pooler.layers.workspace import (Workspace, apply_activation, linear_act_into, linear_into,
                                     writes_into)
from pooler.models.inputs import ModelInputs
from pooler.models.llama import RMSNorm


@dataclass
class RotaryEncoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    norm_eps: float
    rope_theta: float
    rope_factor: float = 1.0      # positions' frequencies divided by this (linear scaling, NTK)
    pre_norm: bool = False        # False: BERT-style post-norm; True: Llama-style pre-norm
    rms_norm: bool = False        # RMSNorm (no bias) instead of LayerNorm
    type_vocab_size: int = 0      # 0: no token type embeddings
    qkv_bias: bool = True
    o_bias: bool = True
    gated_mlp: bool = True
    gate_up_bias: bool = False    # the gated MLP's gate and up (or the plain MLP's fc1)
    down_bias: bool = True        # the MLP's output projection

    @classmethod
    def from_hf(cls, d: dict, *, theta: float, act: str, eps: float, type_vocab: int,
                eps_key: str = "layer_norm_eps", **switches) -> "RotaryEncoderConfig":
        """From a transformers config dict: the sizes every family names the same way, the
        family's defaults for what its configs may leave out (rotary base, activation, norm
        epsilon, token types), and its fixed `switches` (norm placement, biases, MLP kind)."""
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        rope_theta, rope_factor = rope_of(d, theta, head_dim)
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim, hidden_act=d.get("hidden_act", act),
            norm_eps=d.get(eps_key, eps), rope_theta=rope_theta, rope_factor=rope_factor,
            type_vocab_size=d.get("type_vocab_size", type_vocab), **switches)

    @property
    def qkv_sizes(self) -> list[int]:
        return [self.num_attention_heads * self.head_dim,
                self.num_key_value_heads * self.head_dim,
                self.num_key_value_heads * self.head_dim]


def rope_of(d: dict, default_theta: float, head_dim: int) -> tuple[float, float]:
    """(theta, factor) for rotary_cos_sin from transformers' `rope_parameters` (or the older
    `rope_theta` / `rope_scaling` keys): default and linear RoPE, and the NTK scaling of GTE's
    original code, whose frequencies use base * factor and are divided by factor^(2/dim)."""
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling") or {}
    if rope and all(isinstance(v, dict) for v in rope.values()):
        raise ValueError("Per-layer-type rope_parameters are not supported by this family.")
    theta = float(rope.get("rope_theta", d.get("rope_theta", default_theta)))
    params = rope if rope.get("rope_type", "default") != "default" else scaling
    kind = params.get("rope_type", params.get("type", "default")) if params else "default"
    factor = float(params.get("factor", 1.0)) if params else 1.0
    if kind == "default" or factor == 1.0:
        return theta, 1.0
    if kind == "linear":
        return theta, factor
    if kind == "ntk":
        return theta * factor, factor ** (2.0 / head_dim)
    raise ValueError(f"RoPE type {kind!r} is not implemented natively (default, linear and ntk "
                     "are); run this model with runner='transformers'.")


def _norm(cfg: RotaryEncoderConfig) -> nn.Module:
    if cfg.rms_norm:
        return RMSNorm(cfg.hidden_size, cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)


class RotaryEmbeddings(nn.Module):
    """Word (+ token type) embeddings, LayerNorm'd in post-norm models."""

    def __init__(self, cfg: RotaryEncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.token_type_embeddings = (nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
                                      if cfg.type_vocab_size else None)
        self.norm = None if cfg.pre_norm else _norm(cfg)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.word_embeddings(inputs.input_ids)
        if self.token_type_embeddings is not None:
            types = inputs.token_type_ids
            one_type = types is None or self.token_type_embeddings.num_embeddings == 1
            if one_type and not has_lora(self.token_type_embeddings):
                x = x + self.token_type_embeddings.weight[0]  # every token is type 0
            elif one_type:  # through the layer, so a task adapter's update reaches it
                x = x + self.token_type_embeddings(torch.zeros_like(inputs.input_ids))
            else:
                x = x + self.token_type_embeddings(types)
        return x if self.norm is None else self.norm(x)


class RotaryAttention(nn.Module):
    # attention may round fp32 q/k/v to bf16 for its products (pooler/kernels/attention_bf16.c,
    # where the CPU has AVX512_BF16): int8 engines set it (apply_quantization), as for BERT
    attention_bf16_products = False

    def __init__(self, cfg: RotaryEncoderConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.sizes = cfg.qkv_sizes
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.sizes[0], cfg.hidden_size, bias=cfg.o_bias)

    def attend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               inputs: ModelInputs, workspace: Workspace | None = None
               ) -> torch.Tensor:  # [num_tokens, heads * head_dim]
        n = x.shape[0]
        if workspace is not None and writes_into(self.qkv_proj, x):
            # a long fp32 step: into the buffer the layers share (pooler/layers/workspace.py)
            qkv = linear_into(self.qkv_proj, x, workspace.take("wide", n, sum(self.sizes)))
            return self._attend_qkv(qkv, cos, sin, inputs)
        # bf16 and int8 linears: q/k/v leave the projection in bf16 where the bf16 attention
        # kernel takes them (rotated in fp32, rounded back): a long document's attention runs
        # VDPBF16PS products (docs/models/precision.md, "Long documents"). fp32: unaffected
        # (GQA takes torch's attention: it gets fp32 q/k/v as before)
        qkv = linear_act(self.qkv_proj, x, keep_bf16=self.num_heads == self.num_kv_heads and (
            not self.attention_bf16_products or bf16_kernel_takes(self.head_dim)))
        return self._attend_qkv(qkv, cos, sin, inputs)

    def _attend_qkv(self, qkv: torch.Tensor,  # [num_tokens, q + k + v sizes]
                    cos: torch.Tensor, sin: torch.Tensor,
                    inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, heads * head_dim]
        n = qkv.shape[0]
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = apply_rotary_fp32(q.view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary_fp32(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = packed_attention(q, k, v, inputs.seq_lens, inputs.cu_seqlens, inputs.max_seqlen,
                               scale=self.head_dim ** -0.5,
                               num_unattended=inputs.num_unattended,
                               bf16_products=self.attention_bf16_products)
        return out.reshape(n, -1)  # out: [num_tokens, heads, head_dim]


    def attend_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    inputs: ModelInputs, rows: torch.Tensor
                    ) -> torch.Tensor:  # [num_seqs, heads * head_dim]
        """Attention of `rows` alone ([num_seqs] packed indices, one per sequence) against
        every token's keys and values (the pooled-rows route: RotaryEncoder.forward)."""
        n, q_size = x.shape[0], self.sizes[0]
        # q/k/v rounded to bf16 where attend's would be (bf16 and int8 engines)
        keep = self.num_heads == self.num_kv_heads and (
            not self.attention_bf16_products or bf16_kernel_takes(self.head_dim))
        kv = linear_columns(self.qkv_proj, x, q_size, sum(self.sizes), keep)  # [tokens, k + v]
        k, v = kv.split(self.sizes[1:], dim=-1)
        k = apply_rotary_fp32(k.view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q = linear_columns(self.qkv_proj, x.index_select(0, rows), 0, q_size, keep)  # [seqs, q]
        q = apply_rotary_fp32(q.view(-1, self.num_heads, self.head_dim),
                              cos.index_select(0, rows), sin.index_select(0, rows))
        out = attention_for_rows(q, k, v, inputs.seq_lens, self.head_dim ** -0.5,
                                 inputs.num_unattended)
        return out.reshape(rows.shape[0], -1)


class RotaryMLP(nn.Module):
    """Gated: mlp_in makes [gate | up], act(gate) * up goes through mlp_out. Plain: mlp_in is
    fc1, act, then mlp_out (fc2)."""

    def __init__(self, cfg: RotaryEncoderConfig):
        super().__init__()
        self.gated = cfg.gated_mlp
        width = cfg.intermediate_size * (2 if self.gated else 1)
        self.mlp_in = nn.Linear(cfg.hidden_size, width, bias=cfg.gate_up_bias)
        self.mlp_out = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.down_bias)
        self.act = get_activation(cfg.hidden_act)
        self.act_name = cfg.hidden_act
        # Plain MLPs with GELU/ReLU: the activation runs in fc1's GEMM epilogue on CPU.
        self.postop = None if self.gated else onednn_postop(cfg.hidden_act)
        # Gated MLPs: the activation's in-place form on the gate half, where it has one.
        self.gate_postop = onednn_postop(cfg.hidden_act) if self.gated else None

    def inner(self, x: torch.Tensor,
              workspace: Workspace | None = None) -> torch.Tensor:  # [num_tokens, intermediate]
        if workspace is not None and writes_into(self.mlp_in, x):
            # a long fp32 step: the input projection into the shared buffer, the activation in
            # place (plain: at 8,192 x 4,096 oneDNN's fused GELU into a fresh block measured
            # 1.14x the time)
            n = x.shape[0]
            if not self.gated:
                return linear_act_into(self.mlp_in, x,
                                       workspace.take("wide", n, self.mlp_in.out_features),
                                       self.act_name, self.act)
            # gated: [gate | up] and their product in the shared buffers
            inter = self.mlp_in.out_features // 2
            gate, up = linear_into(self.mlp_in, x, workspace.take("wide", n, 2 * inter)
                                   ).chunk(2, dim=-1)  # [num_tokens, inter] views
            act = apply_activation(gate, self.act_name, self.act)
            return torch.mul(act, up, out=workspace.take("mlp_product", n, inter))
        if not self.gated:
            return linear_act(self.mlp_in, x, self.act, self.postop)
        gate, up = linear_act(self.mlp_in, x).chunk(2, dim=-1)  # [num_tokens, inter] views
        if self.gate_postop is not None and gate.dtype == torch.float32:
            # in place on mlp_in's output: one [num_tokens, intermediate] buffer fewer
            return act_in_place(gate, self.act, self.gate_postop) * up
        return self.act(gate).mul_(up)


class RotaryEncoderLayer(nn.Module):
    def __init__(self, cfg: RotaryEncoderConfig):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.attn = RotaryAttention(cfg)
        self.mlp = RotaryMLP(cfg)
        # Post-norm: attn_norm follows the attention residual, mlp_norm the MLP's. Pre-norm:
        # they precede attention and MLP.
        self.attn_norm = _norm(cfg)
        self.mlp_norm = _norm(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                inputs: ModelInputs,
                workspace: Workspace | None = None) -> torch.Tensor:  # [num_tokens, hidden]
        attn, mlp = self.attn, self.mlp
        if self.pre_norm:
            x = linear_add(attn.o_proj, attn.attend(self.attn_norm(x), cos, sin, inputs,
                                                    workspace), x)
            return linear_add(mlp.mlp_out, mlp.inner(self.mlp_norm(x), workspace), x)
        x = linear_add_norm(attn.o_proj, attn.attend(x, cos, sin, inputs, workspace), x,
                            self.attn_norm)
        return linear_add_norm(mlp.mlp_out, mlp.inner(x, workspace), x, self.mlp_norm)


    def forward_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     inputs: ModelInputs, rows: torch.Tensor) -> torch.Tensor:
        """This layer's output on `rows` alone: [num_seqs, hidden] (keys and values still
        from every token of x [num_tokens, hidden])."""
        attn, mlp = self.attn, self.mlp
        if self.pre_norm:
            normed = self.attn_norm(x)  # every token: the keys and values read it
            x = linear_add(attn.o_proj, attn.attend_rows(normed, cos, sin, inputs, rows),
                           x.index_select(0, rows))
            return linear_add(mlp.mlp_out, mlp.inner(self.mlp_norm(x)), x)
        x = linear_add_norm(attn.o_proj, attn.attend_rows(x, cos, sin, inputs, rows),
                            x.index_select(0, rows), self.attn_norm)
        return linear_add_norm(mlp.mlp_out, mlp.inner(x), x, self.mlp_norm)


class RotaryEncoder(nn.Module):
    """The backbone: embeddings, layers, and (pre-norm) the final norm. Subclasses (one thin
    file per family) give the config and the checkpoint's names."""
    # a step whose pooling reads one row per sequence runs the last layer on those rows alone
    # (ModelInputs.output_rows)
    prunes_last_layer = True

    def __init__(self, cfg: RotaryEncoderConfig, layout: str):
        super().__init__()
        self.config = cfg
        self.layout = layout  # post_norm | pre_norm: which names to read (rotary_weights.py)
        self.embeddings = RotaryEmbeddings(cfg)
        self.layers = nn.ModuleList(RotaryEncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = _norm(cfg) if cfg.pre_norm else None

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embeddings(inputs)
        cfg = self.config
        # cos, sin: [num_tokens, 1, head_dim]
        cos, sin = rotary_cos_sin(inputs.positions, cfg.head_dim, cfg.rope_theta, x.dtype,
                                  cfg.rope_factor)
        # long fp32 steps: the widest activations in buffers the layers share for this pass
        # (q/k/v and the MLP's input projection share its "wide" buffer)
        workspace = Workspace.for_step(x, max(sum(cfg.qkv_sizes), cfg.intermediate_size * (
            2 if cfg.gated_mlp else 1)))
        rows = inputs.last_layer_rows(self)
        if rows is None:
            for layer in self.layers:
                x = layer(x, cos, sin, inputs, workspace)
            return x if self.norm is None else self.norm(x)
        for layer in self.layers[:-1]:
            x = layer(x, cos, sin, inputs, workspace)
        out = self.layers[-1].forward_rows(x, cos, sin, inputs, rows)  # [num_seqs, hidden]
        # only the pooled rows hold the model's output: the pooling reads no other
        return scatter_rows(x, rows, out if self.norm is None else self.norm(out))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from pooler.models.rotary_weights import load_rotary_weights
        return load_rotary_weights(self, weights)
