"""The flat, unpadded batch every native model consumes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pooler.layers.lora import LoraRows, lora_active


@dataclass
class ModelInputs:
    input_ids: torch.Tensor             # [num_tokens] int64, all sequences concatenated
    positions: torch.Tensor             # [num_tokens] int64, index of each token in its sequence
    token_type_ids: torch.Tensor | None  # [num_tokens] int64, segment of each token (pairs)
    cu_seqlens: torch.Tensor            # [num_seqs + 1] int32, sequence boundaries
    seq_lens: list[int]                 # [num_seqs] on the host, for per-sequence kernels
    max_seqlen: int
    # [num_seqs] trailing tokens of each sequence that no token attends to (ColBERT query
    # expansion); None when no sequence has any.
    num_unattended: list[int] | None = None
    # LoRA: adapter i of the step owns tokens [lora.bounds[i], lora.bounds[i+1]) ([num_adapters
    # + 1] bounds; sequences are ordered by adapter); None when the step is the base's alone.
    lora: LoraRows | None = None
    # [num_seqs] int64: the one packed row per sequence (in sequence order) that the step's
    # pooling reads, set by the model runner only when every request pools a single row
    # ([CLS], <s>, the last token). A backbone that declares `prunes_last_layer` then computes
    # its last layer on these rows alone and only they hold correct outputs; the others ignore
    # it. None: every row is read.
    output_rows: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def last_layer_rows(self, model: nn.Module, min_layers: int = 1) -> torch.Tensor | None:
        """output_rows where `model` runs its last layer on them alone (the pooled-rows route):
        it declares `prunes_last_layer`, has at least `min_layers` layers, no LoRA adapter is
        active in the pass, and the rows are fewer than the step's tokens; None: every row."""
        rows = self.output_rows
        if rows is None or not getattr(model, "prunes_last_layer", False) or lora_active() \
                or len(model.layers) < min_layers or rows.shape[0] >= self.num_tokens:
            return None
        return rows

    def output_row_positions(self) -> list[int]:
        """[num_seqs] each output row's index in its own sequence (causal and windowed
        attention of a row sees the keys around that position)."""
        rows = self.output_rows
        return (rows - self.cu_seqlens[:-1].to(rows.dtype)).tolist()
