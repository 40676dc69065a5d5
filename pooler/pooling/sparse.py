"""SPLADE sparse embeddings on *ForMaskedLM models.

How sparse embedding maps onto the pooling tasks: it is the `embed` task. A sparse vector is an
embedding of the text (one weight per vocabulary token), and the runner's task set is a fixed
contract (embed, classify, token_embed, token_classify), so no new task is added. On a masked-LM
model the `embed` pooler is `SparseOrDenseEmbedPooler`, which picks per request:
- sparse when `params.extra["sparse"]` is set (a dict of `SparseOptions`, or True), or when the
  folder declares SPLADE (a SpladePooling module) and the request does not say
  `extra["sparse"] = False`;
- dense (the model's pooled hidden state, as before) otherwise.
A sparse result is a [vocab_size] vector with zeros for absent terms, so `encode` and the
server's `/pooling` see a plain vector; `Engine.embed_sparse` turns it into {token_id: weight}.

Weights, as sentence-transformers' SpladePooling and the original SPLADE compute them:
    w[v] = max over the text's tokens t of log(1 + relu(logits[t, v]))   (sum as an option)
with CLS/SEP included by default (`skip_special_tokens=True` drops them, as vLLM does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.mlm_head import MLMHead
from pooler.sparse_layout import SPLADE_POOLINGS, read_splade_layout

# Tokens per chunk scale down with the vocabulary so one chunk of logits stays about 128 MiB fp32.
_CHUNK_ELEMENTS = 1 << 25


@dataclass
class SparseOptions:
    """Per-request sparse settings, carried in `PoolingParams.extra["sparse"]`.

    pooling: "max" | "sum" over tokens; None follows the model (max unless it declares sum).
    top_k: keep only the k largest weights.
    threshold: keep only weights strictly above it (default: every non-zero weight).
    """
    pooling: str | None = None
    top_k: int | None = None
    threshold: float | None = None

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "SparseOptions | None":
        """None when the request did not ask for sparse output either way."""
        raw = extra.get("sparse")
        if raw is None or raw is False:
            return None
        if raw is True:
            return cls()
        if isinstance(raw, SparseOptions):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"extra['sparse'] must be a dict of sparse options or a bool, "
                             f"got {type(raw).__name__}.")
        unknown = set(raw) - {"pooling", "top_k", "threshold"}
        if unknown:
            raise ValueError(f"Unknown sparse options {sorted(unknown)}; valid: pooling, "
                             "top_k, threshold.")
        return cls(**raw).validated()

    def validated(self) -> "SparseOptions":
        if self.pooling is not None and self.pooling not in SPLADE_POOLINGS:
            raise ValueError(f"sparse pooling must be one of {list(SPLADE_POOLINGS)}, "
                             f"got {self.pooling!r}.")
        if self.top_k is not None and (isinstance(self.top_k, bool)
                                       or not isinstance(self.top_k, int) or self.top_k <= 0):
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}.")
        if self.threshold is not None and (isinstance(self.threshold, bool) or
                                           not isinstance(self.threshold, (int, float))):
            raise ValueError(f"threshold must be a number, got {self.threshold!r}.")
        return self

    def as_extra(self) -> dict[str, Any]:
        return {"pooling": self.pooling, "top_k": self.top_k, "threshold": self.threshold}


def splade_activation(logits: torch.Tensor, activation: str = "relu") -> torch.Tensor:
    """log(1 + relu(x)); "log1p_relu" (OpenSearch models) applies log1p once more."""
    weights = torch.log1p(torch.relu(logits))
    return torch.log1p(weights) if activation == "log1p_relu" else weights


def prune(vector: torch.Tensor, top_k: int | None, threshold: float | None) -> torch.Tensor:
    """vector: [vocab] -> [vocab] with weights at or below threshold, and beyond top_k, zeroed."""
    vector = torch.where(vector > (threshold if threshold is not None else 0.0), vector,
                         torch.zeros_like(vector))
    if top_k is not None and top_k < vector.shape[0]:
        kept = torch.zeros_like(vector)
        values, indices = torch.topk(vector, top_k)
        vector = kept.scatter_(0, indices, values)
    return vector


class SpladePooler(nn.Module):
    """MLM logits -> per-token SPLADE weights -> max (or sum) over each request's tokens."""

    def __init__(self, head: MLMHead, pooling: str = "max", activation: str = "relu"):
        super().__init__()
        self.head = head
        self.pooling, self.activation = pooling, activation

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self.head.load_weights(weights)

    def _segments(self, metadata: PoolingMetadata, num_tokens: int) -> torch.Tensor:
        """[num_tokens] request index of each pooled token; num_reqs for the rest."""
        seg = torch.full((num_tokens,), metadata.num_reqs, dtype=torch.long)
        for i, (start, length, params, special) in enumerate(zip(
                metadata.seq_starts, metadata.seq_lens, metadata.pooling_params,
                metadata.special_tokens_masks)):
            if params.skip_special_tokens and special is not None:
                keep = torch.tensor([not s for s in special], dtype=torch.bool)
                seg[start:start + length][keep] = i
            else:
                seg[start:start + length] = i
        return seg

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        num_reqs = metadata.num_reqs
        options = [SparseOptions.from_extra(p.extra) or SparseOptions()
                   for p in metadata.pooling_params]
        for p in metadata.pooling_params:
            if p.dimensions is not None:
                raise ValueError("dimensions does not apply to sparse embeddings; use top_k.")
        modes = [o.pooling or self.pooling for o in options]
        seg = self._segments(metadata, hidden.shape[0])
        rows = torch.nonzero(seg < num_reqs).squeeze(1)  # only tokens some request pools
        seg = seg[rows].to(hidden.device)
        rows = rows.to(hidden.device)
        vocab = self.head.vocab_size
        pooled: dict[str, torch.Tensor | None] = {mode: None for mode in set(modes)}
        chunk = max(1, _CHUNK_ELEMENTS // vocab)
        for begin in range(0, rows.shape[0], chunk):
            logits = self.head(hidden[rows[begin:begin + chunk]]).float()  # [chunk, vocab]
            # Pooled tokens of one request are contiguous: reduce each run of equal seg ids.
            req_ids, counts = torch.unique_consecutive(seg[begin:begin + chunk],
                                                       return_counts=True)
            parts = logits.split(counts.tolist())
            for mode in pooled:
                if pooled[mode] is None:
                    pooled[mode] = torch.zeros(num_reqs, vocab, dtype=torch.float32,
                                               device=hidden.device)
                target = pooled[mode]
                if mode == "max":
                    # log1p(relu(.)) is non-decreasing: the max of the activated logits is the
                    # activation of the max logit, so activate [reqs, vocab] not [tokens, vocab].
                    reduced = torch.stack([part.amax(0) for part in parts])
                    reduced = splade_activation(reduced, self.activation)
                    target[req_ids] = torch.maximum(target[req_ids], reduced)
                else:
                    reduced = torch.stack([splade_activation(part, self.activation).sum(0)
                                           for part in parts])
                    target[req_ids] += reduced
        out = []
        for i, (mode, opt) in enumerate(zip(modes, options)):
            vector = pooled[mode]
            # None: no request had a token to pool (all special tokens, skipped).
            vector = torch.zeros(vocab, device=hidden.device) if vector is None else vector[i]
            out.append(prune(vector, opt.top_k, opt.threshold))
        return out


class SparseOrDenseEmbedPooler(nn.Module):
    """embed on a masked-LM model: SPLADE for sparse requests, the dense pooler otherwise."""
    task = "embed"

    def __init__(self, dense: nn.Module, model_config: ModelConfig, backbone: nn.Module):
        super().__init__()
        layout = read_splade_layout(model_config.root_path)
        self.default_sparse = layout.declared
        self.dense = dense
        self.sparse = SpladePooler(MLMHead(model_config.hf_config, backbone.get_input_embeddings),
                                   layout.pooling, layout.activation)

    @property
    def out_features(self) -> int:
        """Length of a plain embed vector: the vocabulary when the folder declares SPLADE
        (sparse is then the default), else the dense pooler's."""
        return self.sparse.head.vocab_size if self.default_sparse else self.dense.out_features

    def is_sparse(self, params: PoolingParams) -> bool:
        if SparseOptions.from_extra(params.extra) is not None:
            return True
        return self.default_sparse and params.extra.get("sparse", None) is None

    def check_params(self, params: PoolingParams) -> None:
        if params.dimensions is not None and self.is_sparse(params):
            raise ValueError("dimensions does not apply to sparse embeddings (one weight per "
                             "vocabulary term); leave it unset, and use top_k to keep only "
                             "the k largest weights.")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        weights = list(weights)
        consumed = self.sparse.load_weights(weights)
        dense_loader = getattr(self.dense, "load_weights", None)
        if dense_loader is not None:
            consumed |= dense_loader(weights)
        return consumed

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        sparse = [self.is_sparse(p) for p in metadata.pooling_params]
        outputs: list[torch.Tensor | None] = [None] * metadata.num_reqs
        for flag, pooler in ((True, self.sparse), (False, self.dense)):
            indices = [i for i, s in enumerate(sparse) if s == flag]
            if not indices:
                continue
            sub = metadata if len(indices) == metadata.num_reqs else metadata.subset(indices)
            for i, out in zip(indices, pooler(hidden, sub)):
                outputs[i] = out
        return outputs  # type: ignore[return-value]
