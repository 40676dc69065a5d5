"""Opt-in compiled forward for a step of ONE sequence on CPU (a single short query), BERT only.

POOLER_COMPILE_SINGLE_QUERY=1 turns it on. The packed forward runs ~700 small eager ops per
query; this path writes the same encoder with plain torch.nn.functional calls for one
unpadded sequence and hands it to torch.compile (inductor, weights frozen as constants, C++
wrapper, C++ GEMM templates autotuned against oneDNN), so the per-op Python and dispatch cost
goes away. Measured on all-MiniLM-L6-v2 (docs/benchmarks.md): forward + pooling of a 12-token
query 5.4 ms of CPU time vs 8.6 ms for the eager engine call, outputs within 2e-7. The first
call compiles for about a minute (dynamic length: one compile serves every length).
Anything else (several sequences, other families, CUDA, half precision, int8) takes the eager
packed path.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from pooler.models.bert import BertModel

_ACTIVATIONS = {"gelu": "none", "gelu_python": "none", "gelu_new": "tanh",
                "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
_MAX_LEN = 192  # the fp32 math-attention limit of the packed path (layers/attention.py)


def enabled() -> bool:
    return os.environ.get("POOLER_COMPILE_SINGLE_QUERY", "0") == "1"


def build(model: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    """The compiled one-sequence forward of `model`, or None when this path does not apply."""
    if not (enabled() and type(model) is BertModel and device.type == "cpu"
            and dtype == torch.float32 and model.config.hidden_act in _ACTIVATIONS
            and all(type(layer.qkv_proj) is torch.nn.Linear for layer in model.layers)):
        return None
    cfg = model.config
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    head_dim = hidden // heads
    approximate = _ACTIVATIONS[cfg.hidden_act]
    offset = cfg.position_offset

    def forward(input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        length = input_ids.shape[0]  # input_ids: [L] -> [L, hidden]
        x = F.embedding(input_ids, model.word_embeddings.weight) + \
            model.position_embeddings.weight[offset:offset + length]
        x = x + (model.token_type_embeddings.weight[0] if token_type_ids is None
                 else F.embedding(token_type_ids, model.token_type_embeddings.weight))
        norm = model.embed_norm
        x = F.layer_norm(x, (hidden,), norm.weight, norm.bias, norm.eps)
        for layer in model.layers:
            qkv = F.linear(x, layer.qkv_proj.weight, layer.qkv_proj.bias)
            qkv = qkv.view(length, 3, heads, head_dim).permute(1, 2, 0, 3)  # [3, heads, L, d]
            attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [heads, L, d]
            attn = attn.transpose(0, 1).reshape(length, hidden)
            x = F.layer_norm(F.linear(attn, layer.o_proj.weight, layer.o_proj.bias) + x,
                             (hidden,), layer.attn_norm.weight, layer.attn_norm.bias,
                             layer.attn_norm.eps)
            h = F.gelu(F.linear(x, layer.up_proj.weight, layer.up_proj.bias),
                       approximate=approximate)  # [L, intermediate]
            x = F.layer_norm(F.linear(h, layer.down_proj.weight, layer.down_proj.bias) + x,
                             (hidden,), layer.mlp_norm.weight, layer.mlp_norm.bias,
                             layer.mlp_norm.eps)
        return x

    compiled = torch.compile(forward, dynamic=True, options={
        "freezing": True, "cpp_wrapper": True, "max_autotune": True,
        "max_autotune_gemm_backends": "CPP,ATEN"})

    def run(input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor | None:
        if not 1 < input_ids.shape[0] <= _MAX_LEN:
            return None
        return compiled(input_ids, token_type_ids)
    return run
