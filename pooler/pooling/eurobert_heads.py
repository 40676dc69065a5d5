"""EuroBertForSequenceClassification's head: dense -> GELU -> classifier, placed by
`classifier_pooling`: "bos" and "mean" pool the hidden states first (first token, or the mean
over the sequence); "late" (the default) runs the head on every token and averages the logits.
Checkpoint names (after `model.` is stripped from the backbone's): `dense`, `classifier`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pooler.models.weights import copy_named_weights
from pooler.pooling.activation import apply_activation, num_labels_of, sequence_activation
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import pool_sequences

_POOLINGS = ("bos", "mean", "late")


class EuroBertClassifyPooler(nn.Module):
    task = "classify"

    def __init__(self, hf_config: dict):
        super().__init__()
        hidden = hf_config["hidden_size"]
        self.pooling = hf_config.get("classifier_pooling", "late")
        if self.pooling not in _POOLINGS:
            raise ValueError(f"classifier_pooling must be one of {list(_POOLINGS)}, got "
                             f"{self.pooling!r} (config.json).")
        self.dense = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels_of(hf_config))
        self.activation = sequence_activation(hf_config)

    def _head(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., num_labels]
        return self.classifier(F.gelu(self.dense(x)))

    @property
    def reads_one_row(self) -> bool:
        return self.pooling == "bos"

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """The first token of each request for "bos" pooling; None for "mean" and "late",
        which read every token."""
        return list(metadata.seq_starts) if self.pooling == "bos" else None

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        if self.pooling == "late":
            per_token = self._head(hidden)  # [num_tokens, num_labels]
            logits = pool_sequences("mean", per_token, metadata)  # [num_reqs, num_labels]
        else:
            mode = "cls" if self.pooling == "bos" else "mean"
            logits = self._head(pool_sequences(mode, hidden, metadata))
        return [apply_activation(self.activation, row, p.use_activation)
                for row, p in zip(logits, metadata.pooling_params)]

    def load_weights(self, weights) -> set[str]:
        return copy_named_weights(self, weights, "EuroBERT classify head")
