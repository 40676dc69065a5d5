"""schemathesis hooks for tests/server/test_fuzz.py: a rule of the spec that JSON Schema cannot
state, applied to generated bodies the way schemathesis documents (a `filter_body` hook).

Cohere's embed with `truncate: "NONE"` refuses (400, as Cohere does) a text longer than
`max_tokens`, or than the model's maximum without it. A text's token count is not a JSON Schema
notion, so the spec states the rule in those fields' descriptions and the fuzzer sends only such
bodies whose texts surely fit: at most one token per character plus the special tokens (true of
the WordPiece tokenizers fuzzed here). Limits come from the test: POOLER_FUZZ_MAX_LEN (the
model's maximum) and POOLER_FUZZ_SPECIALS (its special tokens per text).

Scoring with long_input "chunk" likewise: a window holds the whole query beside at least twice
chunk_overlap document tokens (a cross-encoder refuses a query or an overlap that leave no room);
only bodies whose query surely leaves that room are sent.
"""
from __future__ import annotations

import os

import schemathesis

_MAX_LEN = int(os.environ.get("POOLER_FUZZ_MAX_LEN", "0"))
_SPECIALS = int(os.environ.get("POOLER_FUZZ_SPECIALS", "2"))


def _cohere_texts(body: dict) -> list[str]:
    """The texts the server embeds: `texts`, else each input's text parts joined by spaces."""
    if isinstance(body.get("texts"), list):
        return [t for t in body["texts"] if isinstance(t, str)]
    texts = []
    for item in body.get("inputs") or []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            texts.append(" ".join(c["text"] for c in content
                                  if isinstance(c, dict) and isinstance(c.get("text"), str)))
    return texts


_QUERY_FIELDS = ("query", "queries", "text_1", "data_1")  # the scoring bodies' query side


def _chunked_windows_fit(body: dict) -> bool:
    """Scoring with long_input "chunk": each window holds the whole query, the pair's special
    tokens and at least twice chunk_overlap document tokens (the field's description states
    it)."""
    queries = next((body[k] for k in _QUERY_FIELDS if k in body), "")
    queries = [queries] if isinstance(queries, str) else queries
    longest = max((len(q) for q in queries if isinstance(q, str)), default=0)
    overlap = body.get("chunk_overlap")
    overlap = overlap if isinstance(overlap, int) and not isinstance(overlap, bool) else 0
    room = _MAX_LEN - longest - _SPECIALS - 1  # a cross-encoder window's document tokens
    return room >= 1 and overlap <= room // 2


@schemathesis.hook
def filter_body(context, body) -> bool:
    scoring = isinstance(body, dict) and any(k in body for k in _QUERY_FIELDS)
    if scoring and body.get("long_input") == "chunk" and _MAX_LEN \
            and not _chunked_windows_fit(body):
        return False
    if not isinstance(body, dict) or body.get("truncate") != "NONE":
        return True
    limit = body.get("max_tokens")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        limit = _MAX_LEN
    if not limit:
        return True
    return all(len(text) + _SPECIALS <= limit for text in _cohere_texts(body))
