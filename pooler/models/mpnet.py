"""MPNet encoder on packed batches (all-mpnet-base-v2 and MPNetFor* task models).

A BERT-style post-norm encoder with two differences: positions start at padding_idx + 1 (as
RoBERTa's do), and every layer adds one shared relative position bias to its attention scores,
looked up from T5-style log buckets of (key position - query position). The bias depends only
on the sequence length, so on the packed batch it is built once per distinct length per
forward, [heads, L, L], and packed_attention adds it per sequence: no padded position is ever
computed. Heads (classifier, token classifier) live in pooler/pooling.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import torch
from torch import nn

from pooler.models.bert import BertLayer, run_layers
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_renamed_weights

# transformers builds MPNet's buckets with these constants whatever the config says
# (compute_position_bias's defaults); the embedding has relative_attention_num_buckets rows.
_NUM_BUCKETS = 32
_MAX_DISTANCE = 128
# MPNet's embeddings hard-code padding_idx = 1: token i of a sequence has position i + 2.
_PADDING_IDX = 1


@dataclass
class MPNetConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 514
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"
    relative_attention_num_buckets: int = 32

    @classmethod
    def from_dict(cls, d: dict) -> "MPNetConfig":
        if d["hidden_size"] % d["num_attention_heads"]:
            raise ValueError("hidden_size must be a multiple of num_attention_heads.")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            max_position_embeddings=d.get("max_position_embeddings", 514),
            layer_norm_eps=d.get("layer_norm_eps", 1e-5), hidden_act=d.get("hidden_act", "gelu"),
            relative_attention_num_buckets=d.get("relative_attention_num_buckets", 32))


@lru_cache(maxsize=256)  # a few hundred distinct lengths in a serving process
def relative_position_buckets(length: int, device: torch.device) -> torch.Tensor:
    """[L, L] int64 bucket of (key - query) for a sequence of `length` tokens: half the buckets
    for keys before the query, half for keys after; exact distances below 8, then log-spaced
    up to 128 (the same arithmetic as transformers, so equal buckets)."""
    pos = torch.arange(length, dtype=torch.long, device=device)
    n = pos[:, None] - pos[None, :]  # query - key
    half = _NUM_BUCKETS // 2
    ret = (n < 0).long() * half
    n = n.abs()
    max_exact = half // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(_MAX_DISTANCE / max_exact)
                         * (half - max_exact)).long()
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n < max_exact, n, large)


class MPNetModel(nn.Module):
    # load_weights reads the checkpoint once, in order: the loader streams it (pooler/loader.py)
    loads_weights_in_one_pass = True
    # its short steps run the C layer stack (run_layers): int8 keeps fp32 copies for it
    short_steps_in_c = True

    # MPNetFor* keep the encoder under `mpnet.`; a bare MPNetModel has no prefix.
    weight_prefixes = ("mpnet.",)

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = MPNetConfig.from_dict(hf_config)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets,
                                                    cfg.num_attention_heads)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def position_bias(self, seq_lens: list[int]) -> dict[int, torch.Tensor]:
        """length -> [heads, L, L] score bias, shared by every layer of this forward."""
        device = self.relative_attention_bias.weight.device
        return {length: self.relative_attention_bias(
                    relative_position_buckets(length, device)).permute(2, 0, 1).contiguous()
                for length in set(seq_lens)}

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        positions = inputs.positions + _PADDING_IDX + 1
        x = self.embed_norm(self.word_embeddings(inputs.input_ids)
                            + self.position_embeddings(positions))
        return run_layers(self, x, inputs, self.position_bias(inputs.seq_lens))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy matching checkpoint tensors in; returns the checkpoint names consumed."""
        return copy_renamed_weights(self, weights, _RENAMES, "MPNet backbone")


# HF parameter name (after the `mpnet.` prefix) -> (our name, slot in the fused q/k/v weight).
_LAYER = r"^encoder\.layer\.(\d+)\."
_RENAMES = [(re.compile(p), r, s) for p, r, s in [
    (r"^embeddings\.LayerNorm\.(weight|bias)$", r"embed_norm.\1", None),
    (r"^embeddings\.(word|position)_embeddings\.weight$", r"\1_embeddings.weight", None),
    (r"^encoder\.relative_attention_bias\.weight$", "relative_attention_bias.weight", None),
    (_LAYER + r"attention\.attn\.q\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 0),
    (_LAYER + r"attention\.attn\.k\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 1),
    (_LAYER + r"attention\.attn\.v\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 2),
    (_LAYER + r"attention\.attn\.o\.(weight|bias)$", r"layers.\1.o_proj.\2", None),
    (_LAYER + r"attention\.LayerNorm\.(weight|bias)$", r"layers.\1.attn_norm.\2", None),
    (_LAYER + r"intermediate\.dense\.(weight|bias)$", r"layers.\1.up_proj.\2", None),
    (_LAYER + r"output\.dense\.(weight|bias)$", r"layers.\1.down_proj.\2", None),
    (_LAYER + r"output\.LayerNorm\.(weight|bias)$", r"layers.\1.mlp_norm.\2", None),
]]
MPNetModel.weight_renames = _RENAMES  # for LoRA adapters (pooler/lora)
