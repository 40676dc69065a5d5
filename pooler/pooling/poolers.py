"""One pooler per task: *which tokens* (pooling method) times *what head*."""
from __future__ import annotations

import torch
from torch import nn

from pooler.pooling.heads import (DenseProjector, finalize_embeddings,
                                  finalize_token_embeddings)
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import pool_sequences, rows_read, split_tokens


class EmbeddingPooler(nn.Module):
    """embed: one vector per request."""
    task = "embed"

    def __init__(self, mode: str, include_prompt: bool, projector: DenseProjector,
                 hidden_size: int):
        super().__init__()
        self.mode, self.include_prompt = mode, include_prompt
        self.projector = projector
        self.hidden_size = hidden_size

    @property
    def out_features(self) -> int:
        """Length of an output vector: the last Dense module's, else the hidden size."""
        return self.projector.out_features or self.hidden_size

    @property
    def reads_one_row(self) -> bool:
        """Whether rows_read can answer (cls, lasttoken), whatever the step."""
        return self.mode in ("cls", "lasttoken")

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """The one row per request this pooler reads (cls, lasttoken), or None (mean, max)."""
        return rows_read(self.mode, metadata)

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        pooled = pool_sequences(self.mode, hidden, metadata, self.include_prompt)  # [R, H]
        return finalize_embeddings(self.projector(pooled), metadata.pooling_params)


class TokenEmbeddingPooler(nn.Module):
    """token_embed: every token's vector, [seq_len, dim] per request."""
    task = "token_embed"

    def __init__(self, hidden_size: int, projector: nn.Module | None = None):
        super().__init__()
        self.projector = projector
        self.hidden_size = hidden_size

    @property
    def out_features(self) -> int:
        """Length of each token's vector."""
        return self.projector.out_features if self.projector is not None else self.hidden_size

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        out = []
        for tokens, params, special in zip(split_tokens(hidden, metadata),
                                           metadata.pooling_params,
                                           metadata.special_tokens_masks):
            if self.projector is not None:
                tokens = self.projector(tokens)
            if params.skip_special_tokens and special is not None:
                keep = torch.tensor([not s for s in special], device=tokens.device)
                tokens = tokens[keep]
            out.append(finalize_token_embeddings(tokens, params))
        return out
