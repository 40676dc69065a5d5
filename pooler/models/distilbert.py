"""DistilBERT (DistilBertModel, DistilBertForSequenceClassification,
DistilBertForTokenClassification) on packed batches.

A six-layer BERT without token types and without a pooler: word + position embeddings, then
post-norm layers that are BERT's under other names (q_lin/k_lin/v_lin/out_lin, sa_layer_norm,
ffn.lin1/lin2, output_layer_norm), so the layer is BERT's. The classification head
(pre_classifier -> ReLU -> classifier on the first token) lives in pooler/pooling/classify.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from pooler.models.bert import BertLayer, run_layers
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_renamed_weights


@dataclass
class DistilBertConfig:
    # Named as BertLayer reads them; config.json says dim, n_layers, n_heads, hidden_dim.
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12  # fixed in transformers' DistilBERT, not in the config

    @classmethod
    def from_dict(cls, d: dict) -> "DistilBertConfig":
        if d["dim"] % d["n_heads"]:
            raise ValueError("dim must be a multiple of n_heads.")
        return cls(vocab_size=d["vocab_size"], hidden_size=d["dim"],
                   num_hidden_layers=d["n_layers"], num_attention_heads=d["n_heads"],
                   intermediate_size=d["hidden_dim"],
                   max_position_embeddings=d.get("max_position_embeddings", 512),
                   hidden_act=d.get("activation", "gelu"))


class DistilBertModel(nn.Module):
    # load_weights reads the checkpoint once, in order: the loader streams it (pooler/loader.py)
    loads_weights_in_one_pass = True
    # its short steps run the C layer stack (run_layers): int8 keeps fp32 copies for it
    short_steps_in_c = True
    # a step whose pooling reads one row per sequence runs the last layer on those rows alone
    # (ModelInputs.output_rows, bert.run_layers)
    prunes_last_layer = True

    # DistilBertFor* keep the encoder under `distilbert.`; a bare DistilBertModel has none.
    weight_prefixes = ("distilbert.",)

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = DistilBertConfig.from_dict(hf_config)
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # Learned or sinusoidal: either way the checkpoint stores the table.
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.embed_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        # token_type_ids, if the tokenizer made any, are ignored: DistilBERT has no such table.
        x = self.embed_norm(self.word_embeddings(inputs.input_ids)
                            + self.position_embeddings(inputs.positions))
        return run_layers(self, x, inputs)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy matching checkpoint tensors in; returns the checkpoint names consumed."""
        return copy_renamed_weights(self, weights, _RENAMES, "DistilBERT backbone")


# HF parameter name (after the `distilbert.` prefix) -> (our name, slot in the fused q/k/v).
_LAYER = r"^transformer\.layer\.(\d+)\."
_RENAMES = [(re.compile(p), r, s) for p, r, s in [
    (r"^embeddings\.LayerNorm\.(weight|bias)$", r"embed_norm.\1", None),
    (r"^embeddings\.(word|position)_embeddings\.weight$", r"\1_embeddings.weight", None),
    (_LAYER + r"attention\.q_lin\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 0),
    (_LAYER + r"attention\.k_lin\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 1),
    (_LAYER + r"attention\.v_lin\.(weight|bias)$", r"layers.\1.qkv_proj.\2", 2),
    (_LAYER + r"attention\.out_lin\.(weight|bias)$", r"layers.\1.o_proj.\2", None),
    (_LAYER + r"sa_layer_norm\.(weight|bias)$", r"layers.\1.attn_norm.\2", None),
    (_LAYER + r"ffn\.lin1\.(weight|bias)$", r"layers.\1.up_proj.\2", None),
    (_LAYER + r"ffn\.lin2\.(weight|bias)$", r"layers.\1.down_proj.\2", None),
    (_LAYER + r"output_layer_norm\.(weight|bias)$", r"layers.\1.mlp_norm.\2", None),
]]
DistilBertModel.weight_renames = _RENAMES  # for LoRA adapters (pooler/lora)
