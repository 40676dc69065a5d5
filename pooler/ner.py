"""Entity spans from per-token label scores (NER, PII detection).

Behaves like the transformers token-classification pipeline on the same model and text, so a
user can switch without surprises:
- special tokens are dropped; a token is a *sub-word continuation* when the tokenizer's model
  is word-aware (WordPiece `##`) and the token string differs in length from its text span,
  else (e.g. SentencePiece) when the character before it is not a space;
- strategies: "none" (one result per token), "simple" (merge adjacent tokens of the same tag,
  a B- tag starts a new entity), "first" / "max" / "average" (first make every word agree on one
  label: its first token's, its most confident token's, or the mean of its tokens' scores);
- entities whose label is in `ignore_labels` are dropped.
BIOES label sets are handled too (S- starts an entity like B-, E- continues it like I-);
the pipeline only knows B-/I-, so the two agree on every BIO model.

`ignore_subwords=True` makes continuation tokens carry no prediction of their own: with
"none" they are left out, with "simple" each word takes its first token's label ("first").
"""
from __future__ import annotations

import json

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from pooler.outputs import Entity

AGGREGATION_STRATEGIES = ("none", "simple", "first", "max", "average")
_WORD_STRATEGIES = ("first", "max", "average")


class SubwordRules:
    """What the tokenizer says about words: token strings, joining them, unknown tokens."""

    def __init__(self, backend: Tokenizer):
        self.backend = backend
        model = backend.model
        self.word_aware = bool(getattr(model, "continuing_subword_prefix", None))
        unk = getattr(model, "unk_token", None)
        if unk:
            self.unk_id = backend.token_to_id(unk)
        else:  # Unigram (SentencePiece, e.g. DeBERTa-v3) keeps only an id, unexposed in Python
            self.unk_id = json.loads(backend.to_str()).get("model", {}).get("unk_id")

    def token(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id)

    def join(self, tokens: list[str]) -> str:
        decoder = self.backend.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)


@dataclass
class _Token:
    word: str
    scores: np.ndarray  # [num_labels]
    start: int | None
    end: int | None
    index: int
    is_subword: bool


def check_strategy(strategy: str, ignore_subwords: bool) -> str:
    if strategy not in AGGREGATION_STRATEGIES:
        raise ValueError(f"aggregation_strategy must be one of {list(AGGREGATION_STRATEGIES)}, "
                         f"got {strategy!r}.")
    if ignore_subwords and strategy in ("max", "average"):
        raise ValueError(f"ignore_subwords=True conflicts with aggregation_strategy="
                         f"{strategy!r}, which scores words from their sub-words; use 'first', "
                         "'simple' or 'none' with ignore_subwords.")
    return strategy


def extract_entities(text: str, token_ids: Sequence[int], scores: np.ndarray,
                     offsets: Sequence[tuple[int, int]] | None,
                     special_tokens_mask: Sequence[int], labels: list[str], rules: SubwordRules,
                     aggregation_strategy: str = "simple", ignore_labels: Sequence[str] = ("O",),
                     ignore_subwords: bool = False) -> list[Entity]:
    """scores: [num_tokens, num_labels] probabilities of every token (special tokens included)."""
    strategy = check_strategy(aggregation_strategy, ignore_subwords)
    tokens = _gather_tokens(text, token_ids, scores, offsets, special_tokens_mask, rules)
    if ignore_subwords:
        if strategy == "none":
            tokens = [t for t in tokens if not t.is_subword]
        elif strategy == "simple":
            strategy = "first"
    if strategy in _WORD_STRATEGIES:
        entities = [_aggregate_word(group, strategy, labels, rules)
                    for group in _words(tokens)]
    else:
        # Each token's best label for all tokens at once (per-token argmax calls measured
        # ~10% of the NER benchmark's post-processing).
        best = scores.argmax(axis=1)  # [num_tokens]
        top = scores.max(axis=1)  # [num_tokens]
        entities = [Entity(score=float(top[t.index]), word=t.word, start=t.start, end=t.end,
                           entity=labels[int(best[t.index])], index=t.index) for t in tokens]
    ignored = set(ignore_labels or ())
    if strategy != "none":
        entities = _group(entities, rules, ignored)
    return [e for e in entities if e.label not in ignored]


def _gather_tokens(text, token_ids, scores, offsets, special_tokens_mask,
                   rules: SubwordRules) -> list[_Token]:
    tokens = []
    for idx, token_id in enumerate(token_ids):
        if special_tokens_mask[idx]:
            continue
        word = rules.token(int(token_id))
        start = end = None
        is_subword = False
        if offsets is not None:
            start, end = offsets[idx]
            span = text[start:end]
            if rules.word_aware:
                is_subword = len(word) != len(span)
            else:  # no word marker in the vocabulary: glued to the previous character
                is_subword = start > 0 and " " not in text[start - 1:start + 1]
            if rules.unk_id is not None and int(token_id) == rules.unk_id:
                word, is_subword = span, False
        tokens.append(_Token(word, scores[idx], start, end, idx, is_subword))
    return tokens


def _words(tokens: list[_Token]) -> list[list[_Token]]:
    """Group each word's first token with its continuation tokens."""
    groups: list[list[_Token]] = []
    for t in tokens:
        if groups and t.is_subword:
            groups[-1].append(t)
        else:
            groups.append([t])
    return groups


def _aggregate_word(group: list[_Token], strategy: str, labels: list[str],
                    rules: SubwordRules) -> Entity:
    if strategy == "first":
        word_scores = group[0].scores
    elif strategy == "max":
        word_scores = max(group, key=lambda t: t.scores.max()).scores
    else:  # average
        word_scores = np.nanmean(np.stack([t.scores for t in group]), axis=0)
    best = int(word_scores.argmax())
    return Entity(score=float(word_scores[best]), word=rules.join([t.word for t in group]),
                  start=group[0].start, end=group[-1].end, entity=labels[best])


def _split_tag(label: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); a label without a known prefix continues like an I- tag."""
    prefix, _, tag = label.partition("-")
    if tag and prefix in ("B", "S"):
        return "B", tag
    if tag and prefix in ("I", "E"):
        return "I", tag
    return "I", label


def _group(entities: list[Entity], rules: SubwordRules, ignored: set[str]) -> list[Entity]:
    """Merge runs of adjacent results with the same tag; a B-/S- tag starts a new entity.
    Groups whose tag is in `ignored` (e.g. "O") are dropped here, never built."""
    groups: list[list[Entity]] = []
    for e in entities:
        if groups:
            bi, tag = _split_tag(e.entity)  # type: ignore[arg-type]
            _, last_tag = _split_tag(groups[-1][-1].entity)  # type: ignore[arg-type]
            if tag == last_tag and bi != "B":
                groups[-1].append(e)
                continue
        groups.append([e])
    return [Entity(score=g[0].score if len(g) == 1 else float(np.mean([e.score for e in g])),
                   word=rules.join([e.word for e in g]), start=g[0].start, end=g[-1].end,
                   entity_group=group_tag)
            for g in groups  # the tag after the B-/I- prefix names the group
            if (group_tag := g[0].entity.split("-", 1)[-1])  # type: ignore[union-attr]
            not in ignored]
