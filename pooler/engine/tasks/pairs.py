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


def pairing(num_queries: int, num_documents: int) -> list[tuple[int, int]]:
    """(query index, document index) per score: 1 query x N documents, or N x N pairwise;
    anything else is an error."""
    if num_queries == 1:
        return [(0, j) for j in range(num_documents)]
    if num_queries == num_documents:
        return [(i, i) for i in range(num_documents)]
    raise ValueError(f"score takes 1 query and N documents, or N queries and N documents "
                     f"(scored pairwise); got {num_queries} queries and {num_documents} "
                     "documents.")


def pair_inputs(queries: Any, documents: Any) -> ScoreRequest:
    """1:1, 1:N (one query, many documents) or N:N (zipped); anything else is an error."""
    qs = normalize_inputs(queries, "queries")
    ds = normalize_inputs(documents, "documents")
    return ScoreRequest(qs, ds, pairing(len(qs), len(ds)))


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
