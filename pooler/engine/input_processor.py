"""Validates user inputs and turns them into token ids for the engine core."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from pooler.config import ModelConfig
from pooler.tokenizer import TextTokenizer

# One input: a text, or token ids the caller already made.
PromptInput = Union[str, Sequence[int], dict]


@dataclass
class ProcessedInput:
    prompt_token_ids: list[int]
    token_type_ids: list[int] | None = None
    special_tokens_mask: list[int] | None = None
    num_prompt_tokens: int = 0
    text: str | None = None
    offsets: list[tuple[int, int]] | None = None
    word_ids: list[int | None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class InputTooLongError(ValueError):
    """An input longer than the allowed length while truncation is off. The servers word it
    as their peer does (vLLM, TEI); the fields say what happened."""

    def __init__(self, index: int, num_tokens: int, max_length: int):
        super().__init__(
            f"Input {index} has {num_tokens} tokens, more than the maximum of {max_length}. "
            "Shorten it, or allow truncation (truncate=True).")
        self.index = index
        self.num_tokens = num_tokens
        self.max_length = max_length


@dataclass
class TruncationOptions:
    """truncate: cut over-long inputs (False makes them an error).
    truncate_prompt_tokens: cut to this many tokens instead of the model's maximum.
    direction: "right" keeps the start of the text, "left" keeps its end."""
    truncate: bool = True
    truncate_prompt_tokens: int | None = None
    direction: str = "right"


def normalize_inputs(inputs: Any, field_name: str = "inputs") -> list[str | list[int]]:
    """Accept a text, a list of texts, token ids, a list of token-id lists, or
    {"prompt_token_ids": [...]} / {"prompt": "..."} dicts; return one entry per input."""
    if isinstance(inputs, (str, dict)):
        inputs = [inputs]
    if not isinstance(inputs, (list, tuple)):
        raise ValueError(f"{field_name} must be a string, a list of strings or token ids, "
                         f"got {type(inputs).__name__}.")
    if len(inputs) == 0:
        raise ValueError(f"{field_name} is empty: pass at least one text or token-id list.")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in inputs):
        return [list(inputs)]  # a single token-id input
    out: list[str | list[int]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, dict):
            if "prompt_token_ids" in item:
                item = item["prompt_token_ids"]
            elif "prompt" in item:
                item = item["prompt"]
            else:
                raise ValueError(f"{field_name}[{i}] is a dict without 'prompt' or "
                                 "'prompt_token_ids'.")
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item):
            if len(item) == 0:
                raise ValueError(f"{field_name}[{i}] is an empty token-id list.")
            out.append(list(item))
        else:
            raise ValueError(f"{field_name}[{i}] must be a string or a list of token ids, "
                             f"got {type(item).__name__}.")
    return out


class InputProcessor:
    def __init__(self, model_config: ModelConfig, tokenizer: TextTokenizer):
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.max_model_len = model_config.max_model_len

    # ---- prompts (sentence-transformers `prompts` / `default_prompt_name`) ----------------
    def resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        if prompt is not None and prompt_name is not None:
            raise ValueError("Pass either prompt or prompt_name, not both.")
        if prompt is not None:
            return prompt
        st = self.model_config.st
        prompts = st.prompts if st is not None else {}
        if prompt_name is not None:
            if prompt_name not in prompts:
                raise ValueError(f"prompt_name {prompt_name!r} is not declared by the model; "
                                 f"declared prompts: {sorted(prompts) or 'none'}.")
            return prompts[prompt_name]
        if st is not None and st.default_prompt_name:
            return prompts.get(st.default_prompt_name)
        return None

    def _num_prompt_tokens(self, prompt: str) -> int:
        # As sentence-transformers: the tokenized prompt without its trailing special token.
        encoded = self.tokenizer.encode_batch([prompt])[0]
        trailing = 1 if encoded.special_tokens_mask and encoded.special_tokens_mask[-1] else 0
        return len(encoded.input_ids) - trailing

    # ---- main entry ---------------------------------------------------------------------
    def max_length_for(self, truncation: TruncationOptions) -> int:
        limit = truncation.truncate_prompt_tokens
        if limit is None:
            return self.max_model_len
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"truncate_prompt_tokens must be a positive integer, got {limit!r}.")
        if limit > self.max_model_len:
            raise ValueError(f"truncate_prompt_tokens={limit} exceeds the model's maximum input "
                             f"length {self.max_model_len}.")
        return limit

    def process(self, inputs: list[str | list[int]], *, pairs: list[str] | None = None,
                truncation: TruncationOptions | None = None,
                prompt: str | None = None, add_special_tokens: bool = True,
                max_pair_tokens: int | None = None, whole: bool = False) -> list[ProcessedInput]:
        """add_special_tokens=False leaves out [CLS]/[SEP] and the like (text inputs).
        max_pair_tokens: cut each second text of a pair to this many tokens first (vLLM's
        max_tokens_per_doc), then apply `truncation` to the whole pair.
        whole=True: no truncation and no length check (the caller splits long inputs into
        windows, see long_inputs.py)."""
        truncation = truncation or TruncationOptions()
        if truncation.direction not in ("right", "left"):
            raise ValueError(f"truncation_direction must be 'right' or 'left', "
                             f"got {truncation.direction!r}.")
        max_length = 1 << 62 if whole else self.max_length_for(truncation)
        results: list[ProcessedInput | None] = [None] * len(inputs)
        text_indices = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if pairs is not None and len(text_indices) != len(inputs):
            raise ValueError("Sentence pairs must be given as texts, not token ids.")
        if pairs is not None and self.model_config.rerank_prompt is not None:
            return self._process_prompted_pairs(inputs, pairs, max_length, truncation)
        for i, item in enumerate(inputs):
            if not isinstance(item, str):
                results[i] = self._process_token_ids(i, item, max_length, truncation)
        if text_indices:
            texts = [inputs[i] for i in text_indices]
            num_prompt_tokens = 0
            if prompt:
                texts = [prompt + t for t in texts]
                num_prompt_tokens = self._num_prompt_tokens(prompt)
            if max_pair_tokens is not None and pairs is not None:
                encoded = self.tokenizer.encode_pairs_capped(
                    texts, pairs, max_pair_tokens,
                    max_length=max_length if truncation.truncate else None,
                    direction=truncation.direction)
            else:
                encoded = self.tokenizer.encode_batch(
                    texts, pairs, max_length=max_length if truncation.truncate and not whole
                    else None, direction=truncation.direction, add_special_tokens=add_special_tokens)
            for i, text, enc in zip(text_indices, texts, encoded):
                if not enc.input_ids:  # an empty text without special tokens: nothing to pool
                    raise ValueError(f"Input {i} has no tokens (an empty text with "
                                     "add_special_tokens=false); pass some text.")
                if not truncation.truncate and len(enc.input_ids) > max_length:
                    raise InputTooLongError(i, len(enc.input_ids), max_length)
                results[i] = ProcessedInput(
                    prompt_token_ids=enc.input_ids, token_type_ids=enc.token_type_ids,
                    special_tokens_mask=enc.special_tokens_mask,
                    num_prompt_tokens=min(num_prompt_tokens, len(enc.input_ids)),
                    text=text, offsets=enc.offsets, word_ids=enc.word_ids)
        return results  # type: ignore[return-value]

    def _process_prompted_pairs(self, queries: list[str], documents: list[str],
                                max_length: int, truncation: TruncationOptions
                                ) -> list[ProcessedInput]:
        """A language-model reranker's pairs (pooler/rerank_prompt.py): prefix, body and
        suffix tokenized separately and joined, as the model card does; an over-long body is
        cut at its end so the prompt's answer position always stays last."""
        prompt = self.model_config.rerank_prompt
        backend = self.tokenizer.backend
        prefix = backend.encode(prompt.prefix, add_special_tokens=False).ids
        suffix = backend.encode(prompt.suffix, add_special_tokens=False).ids
        budget = max_length - len(prefix) - len(suffix)
        if budget <= 0:
            raise ValueError(f"The reranker prompt alone takes {len(prefix) + len(suffix)} "
                             f"tokens, more than the maximum input length {max_length}.")
        bodies = backend.encode_batch([prompt.body(q, d) for q, d in zip(queries, documents)],
                                      add_special_tokens=False)
        out = []
        for i, body in enumerate(bodies):
            ids = body.ids
            if len(ids) > budget:
                if not truncation.truncate:
                    raise ValueError(
                        f"Pair {i} has {len(ids) + len(prefix) + len(suffix)} tokens with the "
                        f"reranker prompt, more than the maximum of {max_length}. Shorten it, "
                        "or allow truncation (truncate=True).")
                ids = ids[:budget]
            out.append(ProcessedInput(prompt_token_ids=prefix + ids + suffix))
        return out

    def _process_token_ids(self, index: int, ids: list[int], max_length: int,
                           truncation: TruncationOptions) -> ProcessedInput:
        vocab_size = self.tokenizer.vocab_size
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            raise ValueError(f"Input {index} has token ids outside the vocabulary "
                             f"[0, {vocab_size}): {bad[:5]}.")
        if len(ids) > max_length:
            if not truncation.truncate:
                raise InputTooLongError(index, len(ids), max_length)
            ids = ids[:max_length] if truncation.direction == "right" else ids[-max_length:]
        return ProcessedInput(prompt_token_ids=list(ids))
