"""Which rows of a step the pooling reads, for the pooled-rows route: when every request pools
a single row of its sequence ([CLS] or last-token embeddings; classifiers, cross-encoders and
decoder rerankers that read [CLS], <s> or the last non-pad token), the backbone's last layer
needs only those rows' outputs. Keys and values still come from every token, but the query,
attention, output projection, norms and MLP of that layer run on one row per sequence:
(1 - ~1/6) / num_layers of the step's work saved at any length, outputs unchanged
(pooler/layers/row_attention.py).

The pooler answers (DispatchPooler.rows_read: None from any task that reads more, or does not
say); the backbone declares that it can (`prunes_last_layer`); the step must have no LoRA
adapter and no image features merged into its sequences. `POOLER_PRUNE_LAST_LAYER=0` turns the
route off (every step computes every row), for debugging and A/B runs.
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.models.inputs import ModelInputs
from pooler.pooling.metadata import PoolingMetadata
from pooler.switch_words import env_off

PRUNE_ENV = "POOLER_PRUNE_LAST_LAYER"


def pruning_enabled(backbone: nn.Module | None) -> bool:
    """Whether steps of this backbone may take the pooled-rows route (read at load)."""
    return not env_off(PRUNE_ENV) and bool(getattr(backbone, "prunes_last_layer", False))


def set_output_rows(inputs: ModelInputs, metadata: PoolingMetadata, pooler: nn.Module,
                    images_merged: bool) -> None:
    """inputs.output_rows: the rows the step's pooling reads, when it reads one per sequence
    and nothing else rules the route out; left None otherwise."""
    if images_merged or inputs.lora is not None:
        return
    rows_read = getattr(pooler, "rows_read", None)
    rows = rows_read(metadata) if rows_read is not None else None
    if rows is None or len(rows) != len(inputs.seq_lens):
        return
    inputs.output_rows = torch.tensor(rows, dtype=torch.long, device=inputs.input_ids.device)
