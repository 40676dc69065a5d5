"""Scores through the runner's late-interaction query cache, in two stages: every distinct query
once as `cache_query` (uses = how many documents it is scored against), then every document as
`score_doc`; the pooling runner's late-interaction runner turns each document's output into its
score. ColBERT (late_interaction.py), BGE-M3 (bge_m3.py) and page retrieval
(page_retrieval.py) score this way.

Cache keys are fresh UUIDs, never derived from a client's ids. If the call is cancelled or
fails before its documents were submitted, the queries it cached are dropped once the engine
has quiesced its requests; once the documents are submitted, each document releases its own
use (scored, failed or aborted), so nothing is left behind either way.
"""
from __future__ import annotations

import uuid
from typing import Any

from pooler.engine.engine_loop import CancelledBeforeSubmit, RequestCancelled
from pooler.engine.tasks.common import TaskEngine
from pooler.engine.tasks.pairs import ScoreRequest, hashable, pair_tokens
from pooler.params import LateInteractionParams


def two_stage(engine: TaskEngine, request: ScoreRequest, build, make_params, use_tqdm,
              priority, cancel) -> list:
    """Run every distinct query once as `cache_query` (uses = its documents), then every
    document as `score_doc`; the runner's late-interaction cache turns each document's output
    into its score(s). `build(items, role)` makes the inputs, `make_params(item, role, li)`
    each request's verified params. Returns the documents' results in pair order, and each
    pair's tokens (its document's, plus its query's on the query's first pair)."""
    used = sorted({qi for qi, _ in request.pairs})
    # Distinct queries are encoded once; each gets a fresh key no client can guess or reuse.
    key_of: dict[int, str] = {}
    by_content: dict[Any, str] = {}
    for qi in used:
        content = hashable(request.queries[qi])
        key_of[qi] = by_content.setdefault(content, uuid.uuid4().hex)
    uses: dict[str, int] = {}
    for qi, _ in request.pairs:
        uses[key_of[qi]] = uses.get(key_of[qi], 0) + 1
    first_of_key = {}
    for qi in used:
        first_of_key.setdefault(key_of[qi], qi)
    query_indices = list(first_of_key.values())

    # Build everything before submitting anything: bad input fails with nothing cached.
    query_inputs = build([request.queries[qi] for qi in query_indices], "query")
    doc_inputs = build([request.documents[di] for _, di in request.pairs], "document")
    query_params = [make_params(item, "query", LateInteractionParams(
        "cache_query", key_of[qi], uses[key_of[qi]])) for qi, item in
        zip(query_indices, query_inputs)]
    doc_params = [make_params(item, "document", LateInteractionParams(
        "score_doc", key_of[qi])) for (qi, _), item in zip(request.pairs, doc_inputs)]

    keys = list(uses)
    try:
        results = engine.run_processed(query_inputs, query_params, priority, use_tqdm,
                                       cancel=cancel, raise_on_error=False)
        failed = [r.error for r in results if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(results)} queries failed: {failed[0]}")
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("cancelled between the query and document stages")
    except BaseException:
        # The documents will never run: drop what the queries cached (once quiesced).
        engine.drop_cached_queries(keys)
        raise
    # From here every document releases its own use, whatever happens to it.
    try:
        results = engine.run_processed(doc_inputs, doc_params, priority, use_tqdm,
                                       cancel=cancel, raise_on_error=False)
    except RequestCancelled as exc:
        if isinstance(exc, CancelledBeforeSubmit):  # no document exists to release its use
            engine.drop_cached_queries(keys)
        raise
    except BaseException:
        # Not a per-request failure (e.g. a refused admission): nothing stays cached.
        engine.drop_cached_queries(keys)
        raise
    failed = [(i, r.error) for i, r in enumerate(results) if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} documents failed; document "
                           f"{request.pairs[failed[0][0]][1]}: {failed[0][1]}")
    query_tokens = {key_of[qi]: len(item.prompt_token_ids)
                    for qi, item in zip(query_indices, query_inputs)}
    return results, pair_tokens(
        request.pairs, [len(item.prompt_token_ids) for item in doc_inputs],
        lambda qi: query_tokens[key_of[qi]], key=lambda qi: key_of[qi])
