"""classify and token_classify poolers: the task heads of *ForSequenceClassification and
*ForTokenClassification checkpoints, on the packed hidden states.

Each head keeps the checkpoint's own parameter names (after the backbone prefix is stripped),
so loading is a name lookup:
- BERT: `pooler.dense` + tanh on [CLS], then `classifier`
- RoBERTa / XLM-R / MPNet: `classifier.dense` + tanh on <s>, then `classifier.out_proj`
- DistilBERT: `pre_classifier` + ReLU on [CLS], then `classifier`
- ELECTRA: `classifier.dense` + GELU on [CLS], then `classifier.out_proj`
- decoders (Llama, Qwen2/3, Mistral, Gemma3): `score` on the last non-pad token, as
  transformers picks it
- token classifiers: `classifier` on every token
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.config import ModelConfig
from pooler.models.weights import copy_named_weights
from pooler.pooling.activation import (apply_activation, num_labels_of, sequence_activation,
                                       token_activation)
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import split_tokens


def load_named(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
               what: str) -> set[str]:
    """Copy tensors whose names equal the module's parameter names; all must be present."""
    return copy_named_weights(
        module, weights, what, "is this folder a fine-tuned task model, and do num_labels / "
        "id2label in config.json match the weights? A base model cannot serve this task")


class BertSequenceHead(nn.Module):
    """[CLS] -> pooler.dense -> tanh -> classifier."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.classifier(torch.tanh(self.pooler.dense(x)))


class RobertaSequenceHead(nn.Module):
    """<s> -> classifier.dense -> tanh -> classifier.out_proj."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.classifier = nn.Module()
        self.classifier.dense = nn.Linear(hidden_size, hidden_size)
        self.classifier.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.classifier.out_proj(torch.tanh(self.classifier.dense(x)))


class DistilBertSequenceHead(nn.Module):
    """[CLS] -> pre_classifier -> ReLU -> classifier."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.pre_classifier = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.classifier(torch.relu(self.pre_classifier(x)))


class ElectraSequenceHead(RobertaSequenceHead):
    """[CLS] -> classifier.dense -> GELU (not tanh) -> classifier.out_proj."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.classifier.out_proj(F.gelu(self.classifier.dense(x)))


class ScoreHead(nn.Module):
    """Decoders: one bias-free `score` projection."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.score = nn.Linear(hidden_size, num_labels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.score(x)


class SequenceClassifyPooler(nn.Module):
    """classify: one score per label per request."""
    task = "classify"

    def __init__(self, head: nn.Module, token: str, activation: str,
                 pad_token_id: int | None = None):
        super().__init__()
        self.head = head
        self.token = token  # "first" | "last_non_pad"
        self.activation = activation
        self.pad_token_id = pad_token_id

    def _token_indices(self, metadata: PoolingMetadata) -> list[int]:
        if self.token == "first":
            return list(metadata.seq_starts)
        ends = [s + n - 1 for s, n in zip(metadata.seq_starts, metadata.seq_lens)]
        if self.pad_token_id is None or metadata.input_ids is None:
            return ends
        # transformers takes the rightmost token that is not the pad id (the first token
        # when every token is one), so a text ending in the pad id pools the same token here.
        ids = metadata.input_ids.cpu()
        indices = []
        for start, length in zip(metadata.seq_starts, metadata.seq_lens):
            keep = (ids[start:start + length] != self.pad_token_id).nonzero()
            indices.append(start + (int(keep[-1]) if len(keep) else 0))
        return indices

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        logits = self.head(hidden[self._token_indices(metadata)])  # [R, num_labels]
        return [apply_activation(self.activation, row, p.use_activation)
                for row, p in zip(logits, metadata.pooling_params)]

    def load_weights(self, weights) -> set[str]:
        return load_named(self.head, weights, "classify head")


class TokenClassifyPooler(nn.Module):
    """token_classify: scores per label for every token, [seq_len, num_labels] per request."""
    task = "token_classify"

    def __init__(self, hidden_size: int, num_labels: int, activation: str,
                 weight_name: str = "classifier"):
        super().__init__()
        self.head = nn.Module()
        setattr(self.head, weight_name, nn.Linear(hidden_size, num_labels))
        self.weight_name = weight_name
        self.activation = activation

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        logits = getattr(self.head, self.weight_name)(hidden)  # [num_tokens, num_labels]
        out = []
        for tokens, params, special in zip(split_tokens(logits, metadata),
                                           metadata.pooling_params,
                                           metadata.special_tokens_masks):
            if params.skip_special_tokens and special is not None:
                tokens = tokens[torch.tensor([not s for s in special], device=tokens.device)]
            out.append(apply_activation(self.activation, tokens, params.use_activation))
        return out

    def load_weights(self, weights) -> set[str]:
        return load_named(self.head, weights, "token_classify head")


# model_type -> the head of its *ForSequenceClassification on the first token (else BERT's).
_FIRST_TOKEN_HEADS = {"roberta": RobertaSequenceHead, "xlm-roberta": RobertaSequenceHead,
                      "camembert": RobertaSequenceHead, "mpnet": RobertaSequenceHead,
                      "distilbert": DistilBertSequenceHead, "electra": ElectraSequenceHead}


def build_sequence_classifier(model_config: ModelConfig) -> SequenceClassifyPooler:
    hf = model_config.hf_config
    hidden, num_labels = model_config.hidden_size, num_labels_of(hf)
    activation = sequence_activation(hf)
    if model_config.decoder_family:  # bidirectional ones too (their head is still `score`)
        return SequenceClassifyPooler(ScoreHead(hidden, num_labels), "last_non_pad", activation,
                                      hf.get("pad_token_id"))
    head_cls = _FIRST_TOKEN_HEADS.get(hf.get("model_type"), BertSequenceHead)
    return SequenceClassifyPooler(head_cls(hidden, num_labels), "first", activation)


def build_token_classifier(model_config: ModelConfig) -> TokenClassifyPooler:
    hf = model_config.hf_config
    name = "score" if model_config.decoder_family else "classifier"
    return TokenClassifyPooler(model_config.hidden_size, num_labels_of(hf), token_activation(hf),
                               name)
