"""What the offline API returns. Vectors are numpy float32 arrays."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class EmbeddingOutput:
    embedding: np.ndarray  # [dim] float32; int8/uint8 [dim] or [dim / 8] when quantized
    num_tokens: int
    request_id: str = ""


@dataclass
class ChunkEmbeddingOutput:
    """embed_chunks (late chunking): one chunk of a document, pooled from the token states of
    the whole document."""
    embedding: np.ndarray  # [dim] float32
    start: int  # character span of the chunk in the document
    end: int
    text: str
    num_tokens: int  # document tokens inside the chunk
    document_tokens: int = 0  # tokens of the whole document, special tokens included


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
class ClassificationOutput:
    """classify: scores of every label (raw logits when use_activation=False)."""
    probs: np.ndarray  # [num_labels] float32
    label: str  # the top label
    score: float  # its score
    labels: list[dict]  # [{"label", "score"}] for every label, highest first
    num_tokens: int
    request_id: str = ""


@dataclass
class TokenClassificationOutput:
    """token_classify: label scores for every token (special tokens dropped on request)."""
    probs: np.ndarray  # [num_tokens, num_labels] float32
    token_ids: list[int]  # [num_tokens], aligned with probs
    labels: list[str]  # [num_tokens] top label of each token
    num_tokens: int  # tokens the model computed (before dropping special tokens)
    request_id: str = ""


@dataclass
class Entity:
    """One NER result, named as the transformers token-classification pipeline names it:
    `entity_group` when tokens were aggregated, `entity` (and `index`) with strategy "none"."""
    score: float
    word: str
    start: int | None  # character span in the original text
    end: int | None
    entity_group: str | None = None
    entity: str | None = None
    index: int | None = None  # token position, strategy "none" only

    @property
    def label(self) -> str:
        return self.entity_group if self.entity_group is not None else self.entity  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        """The pipeline's dict for this entity (same keys, same order)."""
        if self.entity_group is not None:
            return {"entity_group": self.entity_group, "score": self.score, "word": self.word,
                    "start": self.start, "end": self.end}
        return {"entity": self.entity, "score": self.score, "index": self.index,
                "word": self.word, "start": self.start, "end": self.end}


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


@dataclass
class BGEM3Output:
    """BGE-M3's outputs of one input, from one forward pass; those not asked for are None."""
    dense: np.ndarray | None                     # [hidden] float32, L2-normalized
    sparse: SparseEmbeddingOutput | None         # lexical weights, largest first
    colbert: np.ndarray | None                   # [num_tokens - 1, dim], L2-normalized
    num_tokens: int
    request_id: str = ""


@dataclass
class BGEM3Score:
    """One (query, document) pair as FlagEmbedding's compute_score reports it: each mode's
    score and the two weighted combinations."""
    dense: float
    sparse: float
    colbert: float
    sparse_dense: float           # "sparse+dense"
    colbert_sparse_dense: float   # "colbert+sparse+dense"
    query_index: int
    document_index: int
    num_tokens: int = 0  # as ScoreOutput.num_tokens

    def by_mode(self, mode: str) -> float:
        return {"dense": self.dense, "sparse": self.sparse, "colbert": self.colbert,
                "sparse+dense": self.sparse_dense,
                "colbert+sparse+dense": self.colbert_sparse_dense}[mode]


@dataclass
class ScoreOutput:
    """One (query, document) score of `Engine.score`: MaxSim (ColBERT), cosine (bi-encoder)
    or the classifier's relevance (cross-encoder)."""
    score: float
    query_index: int
    document_index: int
    # Tokens the model ran for this pair; a query shared by many pairs counts once, on its
    # first pair, so the sum over a call is the tokens it computed.
    num_tokens: int = 0
    # long_input="chunk": the windows the document was scored in (1 when it fits); None
    # when documents were not chunked.
    num_windows: int | None = None


@dataclass
class RerankResult:
    """One document of `Engine.rerank`, best first. `document` is set when asked for."""
    index: int
    score: float
    document: str | None = None
    num_windows: int | None = None  # as ScoreOutput.num_windows


def as_numpy(data) -> np.ndarray:
    """A runner's output tensor (any dtype) or array as float32 numpy."""
    array = data.float().numpy() if hasattr(data, "numpy") else np.asarray(data)
    return array.astype(np.float32, copy=False)
