"""Texts -> ProcessedInput for ColBERT queries and documents, as PyLate and Stanford ColBERT do.

A marker token right after [CLS]; queries padded with the expansion token up to the query
length (unattended unless the model says so); documents truncated to the document length.
"""
from __future__ import annotations

from pooler.colbert import COLBERT_ROLES, UNATTENDED_KEY, ColBERTConfig, ColBERTTokens
from pooler.engine.input_processor import ProcessedInput
from pooler.tokenizer import TextTokenizer


class ColBERTInputBuilder:
    """Texts -> ProcessedInput for ColBERT queries and documents."""

    def __init__(self, config: ColBERTConfig, tokenizer: TextTokenizer, max_model_len: int):
        self.config = config
        self.tokenizer = tokenizer
        self.tokens = ColBERTTokens.resolve(config, tokenizer)
        self.max_model_len = max_model_len

    def build(self, texts: list[str | list[int]], role: str) -> list[ProcessedInput]:
        """role: "query" | "document". Token-id inputs are taken as the caller made them
        (markers and expansion included), only truncated to the role's length."""
        if role not in COLBERT_ROLES:
            raise ValueError(f"ColBERT role must be one of {list(COLBERT_ROLES)}, got {role!r}.")
        query = role == "query"
        length = self.config.query_length if query else self.config.document_length
        length = min(length or self.max_model_len, self.max_model_len)
        marker = self.tokens.query_marker_id if query else self.tokens.document_marker_id
        text_indices = [i for i, t in enumerate(texts) if isinstance(t, str)]
        encoded = self.tokenizer.encode_batch(
            [texts[i] for i in text_indices],
            max_length=length - 1 if marker is not None else length) if text_indices else []
        by_index = dict(zip(text_indices, encoded))
        out = []
        for i, item in enumerate(texts):
            if i not in by_index:
                ids = list(item)[:length]
                out.append(ProcessedInput(prompt_token_ids=ids))
                continue
            enc = by_index[i]
            ids, special = list(enc.input_ids), list(enc.special_tokens_mask)
            if marker is not None:  # right after [CLS]
                ids.insert(1, marker)
                special.insert(1, 1)
            unattended = 0
            if query and self.config.do_query_expansion and len(ids) < length:
                pad = length - len(ids)
                ids += [self.tokens.expansion_id] * pad
                special += [0] * pad
                unattended = 0 if self.config.attend_to_expansion_tokens else pad
            out.append(ProcessedInput(prompt_token_ids=ids, token_type_ids=[0] * len(ids),
                                      special_tokens_mask=special, text=item,
                                      extra={UNATTENDED_KEY: unattended}))
        return out

    def build_document_windows(self, text: str | list[int],
                               overlap: int | None) -> list[ProcessedInput]:
        """A document as windows of at most the document length, each built as `build`
        builds a document ([CLS], marker, its slice of the text's tokens, [SEP]), consecutive
        windows sharing `overlap` tokens (None: a quarter of a window; at most half). A
        document that fits
        is one window, the same input as build([text], "document"); token-id inputs are
        taken as they are (one window)."""
        from pooler.engine.long_inputs import scoring_overlap, split_into_windows

        if not isinstance(text, str):
            return self.build([text], "document")
        length = min(self.config.document_length or self.max_model_len, self.max_model_len)
        [enc] = self.tokenizer.encode_batch([text])
        ids, special = list(enc.input_ids), list(enc.special_tokens_mask)
        marker = self.tokens.document_marker_id
        if marker is not None:  # right after [CLS], a special token of every window
            ids.insert(1, marker)
            special.insert(1, 1)
        whole = ProcessedInput(prompt_token_ids=ids, token_type_ids=[0] * len(ids),
                               special_tokens_mask=special, text=text)
        if len(ids) <= length:
            windows = [whole]
        else:
            room = length - sum(special)
            windows = split_into_windows(whole, length,
                                         scoring_overlap(overlap, room)).inputs
        for window in windows:
            window.extra = {UNATTENDED_KEY: 0}
        return windows
