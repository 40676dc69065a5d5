"""ModernBERT task heads: a prediction head (dense -> activation -> norm) before the classifier.

ModernBertForSequenceClassification pools first (CLS or mean over the sequence, as
`classifier_pooling` says), then runs the head and the classifier; ModernBertForTokenClassification
runs the head and the classifier on every token. Checkpoint names: `head.dense`, `head.norm`,
`classifier`.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from pooler.layers.activations import get_activation
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import pool_sequences, rows_read, split_tokens


class ModernBertPredictionHead(nn.Module):
    def __init__(self, hf_config: dict):
        super().__init__()
        hidden = hf_config["hidden_size"]
        self.dense = nn.Linear(hidden, hidden, bias=bool(hf_config.get("classifier_bias", False)))
        self.act = get_activation(hf_config.get("classifier_activation", "gelu"))
        self.norm = nn.LayerNorm(hidden, eps=hf_config.get("norm_eps", 1e-5),
                                 bias=bool(hf_config.get("norm_bias", False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden]
        return self.norm(self.act(self.dense(x)))


def classifier_activation(logits: torch.Tensor, hf_config: dict) -> torch.Tensor:
    """Scores as the model card means them: sigmoid for one label or multi-label, else softmax."""
    if hf_config.get("problem_type") == "multi_label_classification" or logits.shape[-1] == 1:
        return torch.sigmoid(logits.float()).to(logits.dtype)
    return torch.softmax(logits.float(), dim=-1).to(logits.dtype)


class _HeadAndClassifier(nn.Module):
    """Shared weights and loading of both ModernBERT classifiers."""

    def __init__(self, hf_config: dict):
        super().__init__()
        self.hf_config = hf_config
        num_labels = len(hf_config.get("id2label") or {}) or int(hf_config.get("num_labels", 2))
        self.head = ModernBertPredictionHead(hf_config)
        self.classifier = nn.Linear(hf_config["hidden_size"], num_labels)

    def classify(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., num_labels]
        return self.classifier(self.head(x))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        consumed = set()
        for name, tensor in weights:
            if name in params:
                if params[name].shape != tensor.shape:
                    raise ValueError(f"Checkpoint tensor {name} has shape "
                                     f"{tuple(tensor.shape)}, expected {tuple(params[name].shape)}.")
                with torch.no_grad():
                    params[name].copy_(tensor)
                consumed.add(name)
        missing = set(params) - consumed
        if missing:
            raise ValueError(f"ModernBERT classifier checkpoint lacks {sorted(missing)}.")
        return consumed


class ModernBertClassifyPooler(_HeadAndClassifier):
    """classify: one score vector per request."""
    task = "classify"

    def __init__(self, hf_config: dict):
        super().__init__(hf_config)
        self.pooling = hf_config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {self.pooling!r}.")

    @property
    def reads_one_row(self) -> bool:
        """Whether rows_read can answer: "cls" pooling; "mean" reads every token."""
        return self.pooling == "cls"

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """Each request's first token for "cls" pooling (the pooled-rows route); None for
        "mean"."""
        return rows_read(self.pooling, metadata)

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        pooled = pool_sequences(self.pooling, hidden, metadata)  # [num_reqs, hidden]
        logits = self.classify(pooled)                            # [num_reqs, num_labels]
        return [classifier_activation(row, self.hf_config) if p.use_activation else row
                for row, p in zip(logits, metadata.pooling_params)]


class ModernBertTokenClassifyPooler(_HeadAndClassifier):
    """token_classify: a score vector per token, [seq_len, num_labels] per request."""
    task = "token_classify"

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        out = []
        for tokens, params, special in zip(split_tokens(hidden, metadata),
                                           metadata.pooling_params,
                                           metadata.special_tokens_masks):
            scores = self.classify(tokens)  # [seq_len, num_labels]
            if params.use_activation:
                scores = classifier_activation(scores, self.hf_config)
            if params.skip_special_tokens and special is not None:
                scores = scores[torch.tensor([not s for s in special], device=scores.device)]
            out.append(scores)
        return out


def modernbert_poolers(head: str, hf_config: dict) -> dict[str, nn.Module]:
    """The ModernBERT-specific poolers for a head kind (replacing generic ones of that task)."""
    if head == "seq_cls":
        return {"classify": ModernBertClassifyPooler(hf_config)}
    if head == "token_cls":
        return {"token_classify": ModernBertTokenClassifyPooler(hf_config)}
    return {}
