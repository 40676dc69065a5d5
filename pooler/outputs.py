"""What the offline API returns. Vectors are numpy float32 arrays."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class EmbeddingOutput:
    embedding: np.ndarray  # [dim] float32
    num_tokens: int
    request_id: str = ""


@dataclass
class TokenEmbeddingOutput:
    embeddings: np.ndarray  # [num_tokens, dim] float32
    num_tokens: int
    request_id: str = ""


@dataclass
class PoolingOutput:
    """Raw output of any task (`Engine.encode`)."""
    data: np.ndarray
    num_tokens: int
    task: str
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SparseEmbeddingOutput:
    """A sparse (SPLADE) embedding: the non-zero vocabulary weights, largest first."""
    indices: np.ndarray  # [nnz] int64 token ids
    values: np.ndarray   # [nnz] float32 weights, descending
    tokens: list[str]    # [nnz] the token strings of `indices`
    num_tokens: int      # tokens of the input text
    request_id: str = ""

    def to_dict(self) -> dict[int, float]:
        """{token_id: weight}."""
        return {int(i): float(v) for i, v in zip(self.indices, self.values)}

    def to_token_dict(self) -> dict[str, float]:
        """{token string: weight}."""
        return {t: float(v) for t, v in zip(self.tokens, self.values)}
