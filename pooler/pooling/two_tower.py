"""embed for image-text models (CLIP, SigLIP): each text's pooled token through the text
projection, then the usual Matryoshka truncation and normalization.

The backbone says which token carries a text's embedding (`text_pool_index`: CLIP's EOS,
SigLIP's last position) and projects it (`project_text`); images never reach this pooler (the
model runner's image path embeds them, pooler/worker/image_runner.py).
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.pooling.heads import finalize_embeddings
from pooler.pooling.metadata import PoolingMetadata


class TwoTowerEmbedPooler(nn.Module):
    task = "embed"

    def __init__(self, backbone: nn.Module):
        super().__init__()
        # Not a submodule: the backbone is the model's, registered there once.
        self._backbone = [backbone]
        self.out_features = int(backbone.embed_dim)

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        backbone = self._backbone[0]
        rows = [start + backbone.text_pool_index(metadata.input_ids[start:start + length])
                for start, length in zip(metadata.seq_starts, metadata.seq_lens)]
        pooled = hidden[torch.tensor(rows, device=hidden.device)]  # [num_reqs, hidden]
        return finalize_embeddings(backbone.project_text(pooled), metadata.pooling_params)
