"""Texts and entity labels -> ProcessedInput for a GLiNER span model, as gliner 0.2.29 builds it.

The text is split into words (pooler/gliner.py's splitter) and cut to the model's `max_len`
words; the sequence is `<<ENT>> label ... <<SEP>>` followed by those words, every entry
tokenized as its own word. The head then needs, per request, the token of each text word (its
first or last sub-token, numbered as gliner numbers them: by changes of word id, after the
prompt's words) and the token of each label (the i-th `<<ENT>>`, or the token after it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pooler.engine.input_processor import InputTooLongError, ProcessedInput
from pooler.gliner import GLiNERLayout, LabelsTooLongError, split_words
from pooler.tokenizer import TextTokenizer


@dataclass
class GLiNERInput:
    processed: ProcessedInput
    words: list[tuple[str, int, int]]  # (word, start, end) in the text, cut to max_len
    labels: list[str]
    head_inputs: dict[str, Any] = field(default_factory=dict)  # PoolingParams.extra["gliner"]


class GLiNERInputBuilder:
    def __init__(self, layout: GLiNERLayout, tokenizer: TextTokenizer, max_model_len: int):
        self.layout = layout
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        class_id = tokenizer.token_to_id(layout.ent_token)
        if class_id is None:
            raise ValueError(f"The GLiNER tokenizer has no {layout.ent_token!r} token; save the "
                             "model with gliner's save_pretrained, which adds it.")
        if layout.class_token_index >= 0 and class_id != layout.class_token_index:
            raise ValueError(f"gliner_config.json says class_token_index="
                             f"{layout.class_token_index}, but the tokenizer gives "
                             f"{layout.ent_token!r} the id {class_id}.")
        self.class_id = class_id

    def build(self, texts: list[str], label_sets: list[list[str]], truncate: bool = True,
              indices: list[int] | None = None) -> list[GLiNERInput]:
        """One input per (text, labels); texts must hold at least one word. `indices` name the
        inputs in errors (their positions in the caller's list)."""
        layout = self.layout
        words = [split_words(t)[:layout.max_len] for t in texts]
        prompts = []
        for labels in label_sets:
            prompt = []
            for label in labels:
                prompt += [layout.ent_token, label]
            prompts.append(prompt + [layout.sep_token])
        encoded = self.tokenizer.encode_words(
            [p + [w for w, _, _ in ws] for p, ws in zip(prompts, words)],
            max_length=self.max_model_len if truncate else None)
        out = []
        for i, (enc, prompt, ws, labels) in enumerate(zip(encoded, prompts, words, label_sets)):
            index = indices[i] if indices is not None else i
            if not truncate and len(enc.input_ids) > self.max_model_len:
                raise InputTooLongError(index, len(enc.input_ids), self.max_model_len)
            label_tokens = [t for t, token_id in enumerate(enc.input_ids)
                            if token_id == self.class_id][:len(labels)]
            if len(label_tokens) < len(labels):
                raise LabelsTooLongError(
                    f"input {index}: its {len(labels)} labels alone take more than the model's "
                    f"{self.max_model_len} tokens; pass fewer labels.")
            if not layout.embed_ent_token:  # the label's own first token stands for it
                label_tokens = [t + 1 for t in label_tokens]
            word_tokens, word_slots = self._word_tokens(enc.word_ids, len(prompt))
            processed = ProcessedInput(prompt_token_ids=enc.input_ids,
                                       token_type_ids=enc.token_type_ids,
                                       special_tokens_mask=enc.special_tokens_mask,
                                       text=texts[i], offsets=enc.offsets, word_ids=enc.word_ids)
            out.append(GLiNERInput(processed, ws, labels, {
                "num_words": len(ws), "word_tokens": word_tokens, "word_slots": word_slots,
                "label_tokens": label_tokens}))
        return out

    def _word_tokens(self, word_ids: list[int | None],
                     num_prompt_words: int) -> tuple[list[int], list[int]]:
        """Token index and word slot of each text word's chosen sub-token, as gliner's
        prepare_word_mask numbers them: a word is counted where the word id changes."""
        last = self.layout.subtoken_pooling == "last"
        tokens, slots = [], []
        seen, previous = 0, None
        for t, word_id in enumerate(word_ids):
            if word_id is not None:
                first = word_id != previous
                seen += first
                following = word_ids[t + 1] if t + 1 < len(word_ids) else None
                chosen = following != word_id if last else first
                if chosen and seen > num_prompt_words:
                    tokens.append(t)
                    slots.append(seen - num_prompt_words - 1)
            previous = word_id
        return tokens, slots
