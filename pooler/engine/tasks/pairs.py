"""(query, document) pairs as every scoring kind takes them: 1:1, 1:N or N:N, and the tokens
each pair counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pooler.engine.input_processor import normalize_inputs


@dataclass
class ScoreRequest:
    queries: list[str | list[int]]
    documents: list[str | list[int]]
    pairs: list[tuple[int, int]]  # (query index, document index) per output


def pair_inputs(queries: Any, documents: Any) -> ScoreRequest:
    """1:1, 1:N (one query, many documents) or N:N (zipped); anything else is an error."""
    qs = normalize_inputs(queries, "queries")
    ds = normalize_inputs(documents, "documents")
    if len(qs) == 1:
        pairs = [(0, j) for j in range(len(ds))]
    elif len(qs) == len(ds):
        pairs = [(i, i) for i in range(len(ds))]
    else:
        raise ValueError(f"score takes 1 query and N documents, or N queries and N documents "
                         f"(scored pairwise); got {len(qs)} queries and {len(ds)} documents.")
    return ScoreRequest(qs, ds, pairs)


def pair_tokens(pairs: list[tuple[int, int]], doc_tokens: list[int], query_tokens,
                key=lambda qi: qi) -> list[int]:
    """Per pair: its document's tokens, plus its query's on the query's first pair."""
    seen = set()
    out = []
    for (qi, _), n in zip(pairs, doc_tokens):
        first = key(qi) not in seen
        seen.add(key(qi))
        out.append(int(n) + (int(query_tokens(qi)) if first else 0))
    return out


def hashable(item):
    return item if isinstance(item, str) else tuple(item)
