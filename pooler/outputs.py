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
class ScoreOutput:
    """One (query, document) score of `Engine.score`: MaxSim (ColBERT), cosine (bi-encoder)
    or the classifier's relevance (cross-encoder)."""
    score: float
    query_index: int
    document_index: int


@dataclass
class RerankResult:
    """One document of `Engine.rerank`, best first. `document` is set when asked for."""
    index: int
    score: float
    document: str | None = None
