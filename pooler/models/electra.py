"""ELECTRA discriminators (ElectraModel, ElectraForSequenceClassification,
ElectraForTokenClassification) on packed batches.

The encoder is BERT's, layer for layer and name for name under `electra.`; the one difference
is that the embeddings may be narrower than the encoder (`embedding_size`, small ELECTRA
models), in which case `embeddings_project` maps them up to hidden_size. The classification
head (dense -> GELU -> out_proj on the first token) lives in pooler/pooling/classify.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Iterable

import torch
from torch import nn

from pooler.models.bert import _RENAMES as _BERT_RENAMES
from pooler.models.bert import BertConfig, BertModel
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_renamed_weights


@dataclass
class ElectraConfig(BertConfig):
    embedding_size: int = 128  # width of the embeddings, before embeddings_project

    @classmethod
    def from_dict(cls, d: dict) -> "ElectraConfig":
        base = BertConfig.from_dict(d)
        return cls(**{f.name: getattr(base, f.name) for f in fields(BertConfig)},
                   embedding_size=int(d.get("embedding_size") or d["hidden_size"]))


_RENAMES = _BERT_RENAMES + [
    (re.compile(r"^embeddings_project\.(weight|bias)$"), r"embeddings_project.\1", None)]


class ElectraModel(BertModel):
    # ElectraFor* keep the encoder under `electra.`; a bare ElectraModel has no prefix.
    weight_prefixes = ("electra.",)
    weight_renames = _RENAMES
    config_class = ElectraConfig

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        cfg = self.config
        self.embeddings_project = (nn.Linear(cfg.embedding_size, cfg.hidden_size)
                                   if cfg.embedding_size != cfg.hidden_size else None)

    def embed(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = super().embed(inputs)  # [num_tokens, embedding_size]
        return x if self.embeddings_project is None else self.embeddings_project(x)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy matching checkpoint tensors in; returns the checkpoint names consumed."""
        return copy_renamed_weights(self, weights, _RENAMES, "ELECTRA backbone")
