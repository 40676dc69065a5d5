"""ModernBERT encoder on packed batches.

Differences from BERT that matter here: no position embeddings (rotary on q/k instead, with one
theta for global layers and another for local ones), pre-norm layers (layer 0 has no attention
norm) closed by a final norm, a GeGLU MLP, optional biases (none by default), and attention that
alternates between global layers and local layers that see `local_attention // 2` tokens on each
side. A step whose pooling reads one row per sequence (CLS embeddings, `classifier_pooling="cls"`
classifiers) runs the last layer and the final norm on those rows alone (ModelInputs.output_rows,
pooler/layers/row_attention.py), within the window where that layer is local. Heads (prediction
head, classifiers, MLM decoder) live in pooler/pooling, never here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.kernels.attention_cpu import bf16_kernel_takes
from pooler.layers.activations import get_activation
from pooler.layers.attention import packed_attention
from pooler.layers.linear import (act_in_place, linear_act, linear_add, linear_columns,
                                  onednn_postop)
from pooler.layers.lora import has_lora
from pooler.layers.row_attention import attention_for_rows, scatter_rows
from pooler.layers.rotary import apply_rotary_fp32, rotary_cos_sin
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_named_weights

GLOBAL, LOCAL = "full_attention", "sliding_attention"


@dataclass
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_types: list[str]
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    local_attention: int = 128
    hidden_activation: str = "gelu"
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    pad_token_id: int = 50283

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def half_window(self) -> int:
        # transformers: a local token attends to keys with |i - j| <= local_attention // 2.
        return self.local_attention // 2

    @classmethod
    def from_dict(cls, d: dict) -> "ModernBertConfig":
        num_layers = d["num_hidden_layers"]
        layer_types = d.get("layer_types")
        if layer_types is None:  # older configs: every n-th layer (from 0) is global
            every = d.get("global_attn_every_n_layers", 3)
            layer_types = [LOCAL if i % every else GLOBAL for i in range(num_layers)]
        if len(layer_types) != num_layers or set(layer_types) - {GLOBAL, LOCAL}:
            raise ValueError(f"layer_types must list {num_layers} entries of {GLOBAL!r} or "
                             f"{LOCAL!r}, got {layer_types!r}.")
        thetas = {GLOBAL: d.get("global_rope_theta", 160_000.0),
                  LOCAL: d.get("local_rope_theta", 10_000.0)}
        for kind, rope in (d.get("rope_parameters") or {}).items():
            if rope is None:
                continue
            if rope.get("rope_type", "default") != "default":
                raise ValueError(f"Only default rotary embeddings are supported for ModernBERT, "
                                 f"got rope_type {rope['rope_type']!r} for {kind}.")
            thetas[kind] = rope.get("rope_theta", thetas[kind])
        if d["hidden_size"] % d["num_attention_heads"]:
            raise ValueError("hidden_size must be a multiple of num_attention_heads.")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=num_layers,
            num_attention_heads=d["num_attention_heads"], layer_types=list(layer_types),
            global_rope_theta=float(thetas[GLOBAL]), local_rope_theta=float(thetas[LOCAL]),
            local_attention=int(d.get("local_attention", 128)),
            hidden_activation=d.get("hidden_activation", "gelu"),
            norm_eps=d.get("norm_eps", 1e-5), norm_bias=bool(d.get("norm_bias", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            pad_token_id=int(d.get("pad_token_id", 50283) or 0))


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)

    def forward(self, input_ids: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:  # [num_tokens, hidden]
        # inputs_embeds: token embeddings with image features already merged in (ColModernVBert);
        # the norm runs after the merge, as transformers does.
        return self.norm(self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds)


def _project(layer: nn.Module, x: torch.Tensor, keep_bf16: bool = False) -> torch.Tensor:
    """layer(x). bf16 and int8 layers through linear_act (keep_bf16: a bf16 result where the
    caller takes one); a plain fp32 nn.Linear through its own forward (MKL on the weight as
    loaded): linear_act's oneDNN path would keep a packed copy of every weight, ~440 MB more
    peak RSS for ModernBERT-base (measured +37-47 MB for 3 of its 22 layers at 2k-8k tokens)
    for a few percent of a long document's time, which attention dominates."""
    return layer(x) if type(layer) is nn.Linear else linear_act(layer, x, keep_bf16=keep_bf16)


def _project_columns(layer: nn.Module, x: torch.Tensor, start: int, stop: int,
                     keep_bf16: bool = False) -> torch.Tensor:
    """_project(layer, x)[:, start:stop], computing only those features where the layer is a
    plain nn.Linear (on its weight's rows, as loaded: no packed copy, as _project)."""
    if type(layer) is not nn.Linear:
        return linear_columns(layer, x, start, stop, keep_bf16)
    bias = None if layer.bias is None else layer.bias[start:stop]
    return F.linear(x, layer.weight[start:stop], bias)


def _project_add(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """layer(x) + residual (an int8 layer adds it in its C epilogue: linear_add). A plain fp32
    nn.Linear without bias (ModernBERT's default) adds the residual inside the GEMM (addmm with
    beta 1: the same one addition per element), saving a pass over [num_tokens, hidden] and a
    block; with a bias or an active LoRA adapter (a forward hook) it goes through the layer."""
    if type(layer) is not nn.Linear:
        return linear_add(layer, x, residual)
    if (layer.bias is None and x.dim() == 2 and residual.dtype == x.dtype == layer.weight.dtype
            and not has_lora(layer)):
        return torch.addmm(residual, x, layer.weight.t())
    return residual + layer(x)


class ModernBertAttention(nn.Module):
    # attention may round fp32 q/k/v to bf16 for its products (pooler/kernels/attention_bf16.c,
    # where the CPU has AVX512_BF16): int8 engines set it (apply_quantization), as for BERT
    attention_bf16_products = False

    def __init__(self, cfg: ModernBertConfig, local: bool):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.half_window = cfg.half_window if local else None
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)

    def attend(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
               inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden], before Wo
        # bf16 and int8 linears: q/k/v leave the projection in bf16 where the bf16 attention
        # kernel takes them (rotated in fp32, rounded back), so a long document's attention,
        # 60% of a ModernBERT-base layer at 8k tokens, runs VDPBF16PS products instead of fp32
        # ones (docs/models/precision.md, "Long documents"). An fp32 engine is unaffected.
        qkv = _project(self.Wqkv, x, keep_bf16=not self.attention_bf16_products
                       or bf16_kernel_takes(self.head_dim))
        qkv = qkv.view(x.shape[0], 3, self.num_heads, self.head_dim)
        cos, sin = rotary
        qk = apply_rotary_fp32(qkv[:, :2], cos, sin)  # [num_tokens, 2, heads, head_dim]
        attn = packed_attention(qk[:, 0], qk[:, 1], qkv[:, 2], inputs.seq_lens,
                                inputs.cu_seqlens, inputs.max_seqlen,
                                half_window=self.half_window, scale=self.head_dim ** -0.5,
                                num_unattended=inputs.num_unattended,
                                bf16_products=self.attention_bf16_products)
        return attn.reshape(x.shape[0], -1)

    def attend_rows(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                    inputs: ModelInputs, rows: torch.Tensor, positions: list[int]
                    ) -> torch.Tensor:  # [num_seqs, hidden], before Wo
        """Attention of `rows` alone ([num_seqs] packed indices, one per sequence, at
        `positions` in it) against every token's keys and values, within the window of a local
        layer (the pooled-rows route: ModernBertModel.forward)."""
        n, hidden = x.shape[0], self.num_heads * self.head_dim
        keep = not self.attention_bf16_products or bf16_kernel_takes(self.head_dim)  # as attend
        cos, sin = rotary
        kv = _project_columns(self.Wqkv, x, hidden, 3 * hidden, keep)  # [num_tokens, 2 * hidden]
        kv = kv.view(n, 2, self.num_heads, self.head_dim)
        k = apply_rotary_fp32(kv[:, 0], cos, sin)  # [num_tokens, heads, head_dim]
        q = _project_columns(self.Wqkv, x.index_select(0, rows), 0, hidden, keep)
        q = apply_rotary_fp32(q.view(-1, self.num_heads, self.head_dim),
                              cos.index_select(0, rows), sin.index_select(0, rows))
        out = attention_for_rows(q, k, kv[:, 1], inputs.seq_lens, self.head_dim ** -0.5,
                                 inputs.num_unattended, query_positions=positions,
                                 half_window=self.half_window)
        return out.reshape(rows.shape[0], -1)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                inputs: ModelInputs) -> torch.Tensor:
        return _project(self.Wo, self.attend(x, rotary, inputs))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes [input | gate]; act(input) * gate goes through Wo."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = get_activation(cfg.hidden_activation)
        self.act_postop = onednn_postop(cfg.hidden_activation)

    def inner(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, intermediate]
        hidden, gate = _project(self.Wi, x).chunk(2, dim=-1)  # [num_tokens, inter] views
        # the activation in place on Wi's own output where it has an in-place form: one
        # [num_tokens, intermediate] buffer fewer to allocate and fault in
        if self.act_postop is not None and hidden.dtype == torch.float32:
            return act_in_place(hidden, self.act, self.act_postop) * gate  # contiguous for Wo
        return self.act(hidden).mul_(gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, hidden]
        return _project(self.Wo, self.inner(x))


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, index: int):
        super().__init__()
        self.layer_type = cfg.layer_types[index]
        # Layer 0's input is the (already normed) embedding output: no attention norm.
        self.attn_norm = nn.Identity() if index == 0 else nn.LayerNorm(
            cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.attn = ModernBertAttention(cfg, local=self.layer_type == LOCAL)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                inputs: ModelInputs) -> torch.Tensor:
        x = _project_add(self.attn.Wo, self.attn.attend(self.attn_norm(x), rotary, inputs), x)
        return _project_add(self.mlp.Wo, self.mlp.inner(self.mlp_norm(x)), x)

    def forward_rows(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                     inputs: ModelInputs, rows: torch.Tensor,
                     positions: list[int]) -> torch.Tensor:  # [num_seqs, hidden]
        """This layer's output on `rows` alone (keys and values still from every token of x
        [num_tokens, hidden])."""
        attn = self.attn.attend_rows(self.attn_norm(x), rotary, inputs, rows, positions)
        x = _project_add(self.attn.Wo, attn, x.index_select(0, rows))
        return _project_add(self.mlp.Wo, self.mlp.inner(self.mlp_norm(x)), x)


class ModernBertModel(nn.Module):
    # load_weights reads the checkpoint once, in order: the loader streams it (pooler/loader.py)
    loads_weights_in_one_pass = True
    # ModernBertFor* keep the encoder under `model.`; a bare ModernBertModel has no prefix.
    weight_prefixes = ("model.",)
    # a step whose pooling reads one row per sequence runs the last layer and the final norm
    # on those rows alone (ModelInputs.output_rows)
    prunes_last_layer = True

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = ModernBertConfig.from_dict(hf_config)
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.tok_embeddings

    def forward(self, inputs: ModelInputs,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:  # [num_tokens, hidden]
        """inputs_embeds ([num_tokens, hidden], before the embedding norm) replaces the token
        embedding lookup when given (a multimodal model merged image features into it)."""
        x = self.embeddings(inputs.input_ids, inputs_embeds)
        cfg = self.config
        rotary = {kind: rotary_cos_sin(inputs.positions, cfg.head_dim, theta, x.dtype)
                  for kind, theta in ((GLOBAL, cfg.global_rope_theta),
                                      (LOCAL, cfg.local_rope_theta))
                  if kind in cfg.layer_types}
        rows = inputs.last_layer_rows(self)
        if rows is None:
            for layer in self.layers:
                x = layer(x, rotary[layer.layer_type], inputs)
            return self.final_norm(x)
        for layer in self.layers[:-1]:
            x = layer(x, rotary[layer.layer_type], inputs)
        last = self.layers[-1]
        # each row's index in its own sequence: a local last layer sees the keys around it
        out = last.forward_rows(x, rotary[last.layer_type], inputs, rows,
                                inputs.output_row_positions())
        # only the pooled rows hold the model's output: the pooling reads no other
        return scatter_rows(x, rows, self.final_norm(out))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names (prefix stripped) equal our parameter names; returns those consumed."""
        return copy_named_weights(self, weights, "ModernBERT backbone")
