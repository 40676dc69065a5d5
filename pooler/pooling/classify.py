"""classify and token_classify poolers: the task heads of *ForSequenceClassification and
*ForTokenClassification checkpoints, on the packed hidden states.

Each head keeps the checkpoint's own parameter names (after the backbone prefix is stripped),
so loading is a name lookup:
- BERT, NomicBert, GTE: `pooler.dense` + tanh on [CLS], then `classifier`
- DeBERTa v1/v2/v3: the same names (ContextPooler), with `pooler_hidden_act` instead of tanh
- RoBERTa / XLM-R / MPNet / Jina v3: `classifier.dense` + tanh on <s>, then `classifier.out_proj`
- DistilBERT: `pre_classifier` + ReLU on [CLS], then `classifier`
- ELECTRA: `classifier.dense` + GELU on [CLS], then `classifier.out_proj`
- decoders (Llama, Qwen2/3, Mistral, Gemma3): `score` on the last non-pad token, as
  transformers picks it
- language-model rerankers (`classifier_from_token`, Qwen3-Reranker): rows of `lm_head` for
  the given tokens on the last token (pooler/rerank_prompt.py)
- token classifiers: `classifier` on every token
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.config import ModelConfig
from pooler.layers.activations import get_activation
from pooler.models.weights import copy_named_weights
from pooler.pooling.activation import (apply_activation, num_labels_of, sequence_activation,
                                       token_activation)
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import split_tokens
from pooler.rerank_prompt import check_classifier_from_token

_DEBERTA_TYPES = ("deberta", "deberta-v2")

def load_named(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
               what: str) -> set[str]:
    """Copy tensors whose names equal the module's parameter names; all must be present."""
    return copy_named_weights(
        module, weights, what, "is this folder a fine-tuned task model, and do num_labels / "
        "id2label in config.json match the weights? A base model cannot serve this task")


class BertSequenceHead(nn.Module):
    """[CLS] -> pooler.dense -> tanh -> classifier. DeBERTa's ContextPooler has the same
    weights with its own activation (`pooler_hidden_act`, GELU by default)."""

    def __init__(self, hidden_size: int, num_labels: int, activation: str = "tanh"):
        super().__init__()
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_labels)
        self.act = get_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.classifier(self.act(self.pooler.dense(x)))


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


class TokenRowsHead(nn.Module):
    """A causal LM's logits for a few tokens, as a classifier: the lm_head rows of those
    tokens; with `difference`, the one row lm_head[yes] - lm_head[no] (the second token minus
    the first), whose sigmoid equals softmax over the two logits (vLLM's conversion)."""

    def __init__(self, hidden_size: int, token_ids: list[int], difference: bool,
                 input_embeddings: nn.Embedding, tied: bool):
        super().__init__()
        self.token_ids = token_ids
        self.difference = difference
        self.score = nn.Linear(hidden_size, 1 if difference else len(token_ids), bias=False)
        # Tied checkpoints (Qwen3-Reranker-0.6B) have no lm_head: the embedding matrix is it.
        self._embeddings = [input_embeddings] if tied else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, num_labels]
        return self.score(x)

    def load_weights(self, weights) -> set[str]:
        lm_head = next((t for n, t in weights if n == "lm_head.weight"), None)
        if lm_head is None and self._embeddings:
            lm_head = self._embeddings[0].weight
        if lm_head is None:
            raise ValueError("classifier_from_token needs the language model head: the "
                             "checkpoint has no lm_head.weight and tie_word_embeddings is off.")
        rows = lm_head.detach()[self.token_ids].float()  # [num_tokens, hidden]
        weight = rows[1:2] - rows[0:1] if self.difference else rows
        with torch.no_grad():
            self.score.weight.copy_(weight)
        return {"lm_head.weight"}


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

    reads_one_row = True  # rows_read always answers

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """The one row per request the head reads: the very rows forward indexes."""
        return self._token_indices(metadata)

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        logits = self.head(hidden[self._token_indices(metadata)])  # [R, num_labels]
        return [apply_activation(self.activation, row, p.use_activation)
                for row, p in zip(logits, metadata.pooling_params)]

    def load_weights(self, weights) -> set[str]:
        if isinstance(self.head, TokenRowsHead):
            return self.head.load_weights(weights)
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
                      "distilbert": DistilBertSequenceHead, "electra": ElectraSequenceHead,
                      "jina_embeddings_v3": RobertaSequenceHead}


def build_sequence_classifier(model_config: ModelConfig,
                              backbone: nn.Module | None = None) -> SequenceClassifyPooler:
    hf = model_config.hf_config
    hidden, num_labels = model_config.hidden_size, num_labels_of(hf)
    activation = sequence_activation(hf, model_config.st.extra if model_config.st else None)
    tokens = check_classifier_from_token(hf)
    if tokens is not None:
        head = TokenRowsHead(hidden, _token_ids(model_config, tokens),
                             bool(hf.get("is_original_qwen3_reranker")),
                             backbone.get_input_embeddings(),
                             bool(hf.get("tie_word_embeddings", False)))
        # The causal LM's answer position: the last token, whatever its id.
        return SequenceClassifyPooler(head, "last_non_pad", activation, None)
    if model_config.decoder_family:  # bidirectional ones too (their head is still `score`)
        return SequenceClassifyPooler(ScoreHead(hidden, num_labels), "last_non_pad", activation,
                                      hf.get("pad_token_id"))
    if hf.get("model_type") in _DEBERTA_TYPES:
        pooler_size = hf.get("pooler_hidden_size", hidden)
        if pooler_size != hidden:
            raise ValueError(f"DeBERTa pooler_hidden_size ({pooler_size}) must equal "
                             f"hidden_size ({hidden}), as transformers' ContextPooler needs.")
        head = BertSequenceHead(hidden, num_labels, hf.get("pooler_hidden_act", "gelu"))
        return SequenceClassifyPooler(head, "first", activation)
    head_cls = _FIRST_TOKEN_HEADS.get(hf.get("model_type"), BertSequenceHead)
    return SequenceClassifyPooler(head_cls(hidden, num_labels), "first", activation)


def build_token_classifier(model_config: ModelConfig) -> TokenClassifyPooler:
    hf = model_config.hf_config
    name = "score" if model_config.decoder_family else "classifier"
    return TokenClassifyPooler(model_config.hidden_size, num_labels_of(hf), token_activation(hf),
                               name)


def _token_ids(model_config: ModelConfig, tokens: list[str]) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_config.path / "tokenizer.json"))
    ids = [tokenizer.token_to_id(t) for t in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None]
    if unknown:
        raise ValueError(f"classifier_from_token: {unknown} are not tokens of this model's "
                         "vocabulary; name tokens exactly as tokenizer.json spells them.")
    return ids
