"""Text -> token ids with the `tokenizers` library, configured the way the reference libraries do.

A `tokenizer.json` can carry its own padding and truncation (all-MiniLM-L6-v2's pads everything
to 128): we always clear both and truncate per request ourselves.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer


@dataclass
class TokenizedInput:
    input_ids: list[int]
    token_type_ids: list[int]
    special_tokens_mask: list[int]        # 1 where the token is [CLS]/[SEP]/<s>...
    offsets: list[tuple[int, int]]        # character span of each token in its text
    word_ids: list[int | None]
    truncated: bool                       # tokens were cut to fit max_length


class TextTokenizer:
    """Thread-safe wrapper: one immutable `Tokenizer` per truncation setting."""

    def __init__(self, path: Path, tokenizer_config: dict, lowercase: bool = False):
        tokenizer_file = path / "tokenizer.json"
        if tokenizer_file.is_file():
            base = Tokenizer.from_file(str(tokenizer_file))
        elif (path / "vocab.txt").is_file():
            from tokenizers.implementations import BertWordPieceTokenizer
            base = BertWordPieceTokenizer(
                str(path / "vocab.txt"),
                lowercase=bool(tokenizer_config.get("do_lower_case", True)))._tokenizer
        else:
            hint = ""
            if any((path / n).is_file() for n in ("spm.model", "sentencepiece.bpe.model")):
                # e.g. microsoft/deberta-v3-base ships only its SentencePiece model.
                hint = (" It has a SentencePiece model: convert it once with `AutoTokenizer."
                        "from_pretrained(folder).save_pretrained(folder)` (transformers, "
                        "sentencepiece), which writes tokenizer.json.")
            elif (path / "spiece.model").is_file():
                # google/siglip-* (SigLIP 1): a slow SentencePiece tokenizer that also strips
                # punctuation, with no tokenizer.json form in transformers.
                hint = (" It has only a SentencePiece spiece.model (SigLIP 1's tokenizer), "
                        "which pooler does not read; SigLIP2 and CLIP folders ship a "
                        "tokenizer.json.")
            raise FileNotFoundError(f"{path} has neither tokenizer.json nor vocab.txt.{hint}")
        base.no_padding()
        base.no_truncation()
        # sentence_bert_config.json's do_lower_case lowercases the text before tokenizing.
        self._lowercase = lowercase
        self._base = base
        self._serialized = base.to_str()
        self._truncating: dict[tuple[int, str], Tokenizer] = {}
        self._lock = threading.Lock()
        self.config = tokenizer_config
        self._num_special = {pair: sum(base.encode("", "" if pair else None).special_tokens_mask)
                             for pair in (False, True)}

    def clear_cache(self) -> None:
        """Drop the per-truncation tokenizer clones (they are rebuilt on demand)."""
        with self._lock:
            self._truncating = {}

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (read-only use: model facts, decoder)."""
        return self._base

    @property
    def vocab_size(self) -> int:
        return self._base.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._base.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._base.id_to_token(token_id)

    def special_token_id(self, name: str) -> int | None:
        """Id of e.g. `cls_token`, `sep_token`, `mask_token`, `pad_token` as the config names it."""
        token = self.config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        return self._base.token_to_id(token) if token else None

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self._num_special[bool(pair)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._base.decode(ids, skip_special_tokens=skip_special_tokens)

    def _tokenizer_for(self, max_length: int | None, direction: str) -> Tokenizer:
        if max_length is None:
            return self._base
        key = (max_length, direction)
        tokenizer = self._truncating.get(key)
        if tokenizer is None:
            with self._lock:
                tokenizer = self._truncating.get(key)
                if tokenizer is None:
                    tokenizer = Tokenizer.from_str(self._serialized)
                    tokenizer.enable_truncation(max_length, direction=direction)
                    self._truncating[key] = tokenizer
        return tokenizer

    def encode_batch(self, texts: list[str], pairs: list[str] | None = None, *,
                     max_length: int | None = None, direction: str = "right",
                     add_special_tokens: bool = True) -> list[TokenizedInput]:
        """Tokenize; when max_length is given, truncate to it (counting special tokens)."""
        if self._lowercase:
            texts = [t.lower() for t in texts]
            pairs = [p.lower() for p in pairs] if pairs is not None else None
        if max_length is not None and max_length < self.num_special_tokens_to_add(pairs is not None):
            raise ValueError(f"truncation length {max_length} leaves no room for the "
                             "model's special tokens.")
        tokenizer = self._tokenizer_for(max_length, direction)
        if len(texts) == 1:  # one text: `encode` skips the batch call's thread-pool hand-off
            pair = pairs[0] if pairs is not None else None
            return [_to_input(tokenizer.encode(texts[0], pair,
                                               add_special_tokens=add_special_tokens))]
        batch = list(zip(texts, pairs)) if pairs is not None else texts
        encodings = tokenizer.encode_batch(batch, add_special_tokens=add_special_tokens)
        return [_to_input(e) for e in encodings]

    def encode_words(self, inputs: list[list[str]], *,
                     max_length: int | None = None) -> list[TokenizedInput]:
        """Inputs given as lists of words, each word tokenized on its own (transformers'
        is_split_into_words); `word_ids` then index those words. Right-truncated to max_length
        (special tokens counted) when it is given."""
        tokenizer = self._tokenizer_for(max_length, "right")
        encodings = tokenizer.encode_batch(inputs, is_pretokenized=True)
        return [_to_input(e) for e in encodings]

    def encode_pairs_capped(self, texts: list[str], pairs: list[str], max_pair_tokens: int, *,
                            max_length: int | None = None,
                            direction: str = "right") -> list[TokenizedInput]:
        """Pairs whose second text is first cut to `max_pair_tokens` tokens (its end is
        dropped), then, when `max_length` is given, the pair is cut to fit with its special
        tokens by the tokenizers library's longest-first rule."""
        if self._lowercase:
            texts = [t.lower() for t in texts]
            pairs = [p.lower() for p in pairs]
        budget = None
        if max_length is not None:
            budget = max_length - self.num_special_tokens_to_add(pair=True)
            if budget <= 0:
                raise ValueError(f"truncation length {max_length} leaves no room for the "
                                 "model's special tokens.")
        firsts = self._base.encode_batch(texts, add_special_tokens=False)
        seconds = self._base.encode_batch(pairs, add_special_tokens=False)
        out = []
        for first, second in zip(firsts, seconds):
            second.truncate(max_pair_tokens, direction="right")
            n1, n2 = len(first.ids), len(second.ids)
            if budget is not None and n1 + n2 > budget:
                keep1, keep2 = _longest_first(n1, n2, budget)
                first.truncate(keep1, direction=direction)
                second.truncate(keep2, direction=direction)
            joined = self._base.post_process(first, second, add_special_tokens=True)
            out.append(_to_input(joined))
        return out

    def encode_pair_windows(self, text: str, pair: str, max_length: int,
                            overlap: int | None, max_pair_tokens: int | None = None
                            ) -> tuple[list[TokenizedInput], int]:
        """A (query, document) pair whose document is cut into windows that each fit beside
        the whole query within `max_length` (special tokens counted), consecutive windows
        sharing `overlap` document tokens (None: a quarter of a window, at most half). A pair
        that fits is
        one window, the same tokens as encode_batch([text], [pair]). Returns the windows and
        the document tokens one window holds. max_pair_tokens: the document is first cut to
        that many tokens (vLLM's max_tokens_per_doc). ValueError when the query leaves no room or
        the overlap does not fit in a window (the message names chunk_overlap)."""
        if self._lowercase:
            text, pair = text.lower(), pair.lower()
        first = self._base.encode(text, add_special_tokens=False)
        second = self._base.encode(pair, add_special_tokens=False)
        if max_pair_tokens is not None:
            second.truncate(max_pair_tokens, direction="right")
        num_special = self.num_special_tokens_to_add(pair=True)
        room = max_length - num_special - len(first.ids)
        if room <= 0:
            raise ValueError(
                f"The query has {len(first.ids)} tokens: with the {num_special} special tokens "
                f"it leaves no room for a document window within {max_length} tokens. "
                "Shorten the query (long_input='chunk' windows the documents only).")
        if overlap is None:
            overlap = room // 4
        if isinstance(overlap, bool) or not isinstance(overlap, int) or overlap < 0:
            raise ValueError(f"chunk_overlap must be a non-negative integer, got {overlap!r}.")
        if overlap > room // 2:  # windows move by half a window at least: <= 2x the tokens
            raise ValueError(f"chunk_overlap={overlap} must be at most half the document "
                             f"tokens a window holds beside this query ({room // 2}: {room} = "
                             f"{max_length} - {len(first.ids)} query tokens - {num_special} "
                             "special tokens).")
        if len(second.ids) > room:
            # The tokenizers library's overflow: windows of `room` tokens, `overlap` shared.
            second.truncate(room, stride=overlap, direction="right")
            pieces = [second] + list(second.overflowing)
        else:
            pieces = [second]
        return [_to_input(self._base.post_process(first, piece, add_special_tokens=True))
                for piece in pieces], room


def _longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """Tokens kept of each text of a pair, as `tokenizers` truncates with longest_first: the
    longer text gives way alone if the shorter fits in half; else each keeps half (the longer
    one the odd token)."""
    short, long_ = min(n1, n2), max(n1, n2)
    keep_long = short if short > budget else max(short, budget - short)
    keep_short = short
    if keep_short + keep_long > budget:
        keep_short, keep_long = budget // 2, budget // 2 + budget % 2
    return (keep_long, keep_short) if n1 > n2 else (keep_short, keep_long)


def _to_input(encoding: Encoding) -> TokenizedInput:
    return TokenizedInput(
        input_ids=list(encoding.ids),
        token_type_ids=list(encoding.type_ids),
        special_tokens_mask=list(encoding.special_tokens_mask),
        offsets=list(encoding.offsets),
        word_ids=list(encoding.word_ids),
        truncated=bool(encoding.overflowing),
    )
