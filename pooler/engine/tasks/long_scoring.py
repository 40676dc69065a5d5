"""Long documents in score / rerank (`long_input="chunk"`): a document longer than the model
takes is scored window by window instead of being cut or refused.

- Cross-encoder: the document is split into windows that each fit beside the whole query
  (consecutive windows share `chunk_overlap` document tokens: default a quarter of a window,
  at most half, so a document costs at most about twice its tokens);
  every (query, window) pair of the call runs in the same packed engine batches, and the
  document's score is its windows' scores aggregated by `chunk_aggregate`: "max" (MaxP, the
  default: the best passage decides) or "mean".
- Bi-encoder: the document is embedded window by window (long_inputs.split_into_windows, as
  embed(long_input="chunk") windows it); each window's cosine with the query is a window score,
  aggregated the same way.
- ColBERT: the windows' token vectors are concatenated and the query is scored by MaxSim over
  them all, i.e. each query token takes its best match anywhere in the document. A ColBERT
  document is a bag of token vectors, so the union of its windows is the document the model
  would have seen without a length limit; a token in two overlapping windows counts once (max
  is idempotent), from the window where it matches best. chunk_aggregate does not apply.

A document that fits is one window: its score is the unchunked score. Each result says how
many windows its document took.
"""
from __future__ import annotations

import numpy as np

from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.engine import long_inputs
from pooler.engine.input_processor import ProcessedInput, TruncationOptions
from pooler.engine.tasks.common import TaskEngine, tokenizing
from pooler.engine.tasks.pairs import ScoreRequest, pair_tokens
from pooler.outputs import as_numpy
from pooler.params import PoolingParams

# (scores, tokens, windows) per pair, in pair order.
WindowedScores = tuple[list[float], list[int], list[int]]


def cross_encoder_window_scores(engine: TaskEngine, request: ScoreRequest,
                                truncation: TruncationOptions, overlap: int | None,
                                aggregate: str, use_activation, use_tqdm, priority,
                                cancel, max_tokens_per_doc: int | None = None
                                ) -> WindowedScores:
    """Every (query, window) pair classified in one engine run; window scores aggregated.
    max_tokens_per_doc cuts each document first, then the rest is windowed."""
    from pooler.engine.tasks.classification import check_pairs

    if not all(isinstance(x, str) for x in request.queries + request.documents):
        raise ValueError("A cross-encoder scores text pairs: pass queries and documents as "
                         "strings, not token ids.")
    if engine.model_config.rerank_prompt is not None:
        raise ValueError("long_input='chunk' applies to encoder cross-encoders; this model "
                         "scores through a reranker prompt (a language model), whose pairs "
                         "are cut at the end of the document.")
    check_pairs(engine, [request.queries[qi] for qi, _ in request.pairs],
                [request.documents[di] for _, di in request.pairs])
    limit = engine.processor.max_length_for(truncation)
    windows: list[list] = []
    with tokenizing():
        for qi, di in request.pairs:
            windows.append(engine.tokenizer.encode_pair_windows(
                request.queries[qi], request.documents[di], limit, overlap,
                max_tokens_per_doc)[0])
    flat = [ProcessedInput(prompt_token_ids=w.input_ids, token_type_ids=w.token_type_ids,
                           special_tokens_mask=w.special_tokens_mask)
            for group in windows for w in group]
    params = engine.verify_params(PoolingParams(task="classify", use_activation=use_activation))
    results = iter(engine.run_processed(flat, [params] * len(flat), priority, use_tqdm,
                                        cancel=cancel))
    scores, tokens = [], []
    for group in windows:
        window_scores = []
        for _ in group:
            probs = as_numpy(next(results).data)  # [num_labels]
            # One relevance label (the usual reranker): its score; else the top class's.
            window_scores.append(float(probs[0]) if probs.shape[0] == 1 else float(probs.max()))
        scores.append(long_inputs.aggregate(window_scores, aggregate))
        tokens.append(sum(len(w.input_ids) for w in group))
    return scores, tokens, [len(group) for group in windows]


def bi_encoder_window_scores(engine: TaskEngine, request: ScoreRequest,
                             truncation: TruncationOptions, overlap: int | None,
                             aggregate: str, use_tqdm, priority, cancel,
                             max_tokens_per_doc: int | None = None) -> WindowedScores:
    """Each distinct query and every window of each distinct document embedded once, in one
    engine run; a pair's window scores are the query's cosines with its document's windows.
    max_tokens_per_doc cuts each document (special tokens counted) before it is windowed."""
    used_q = sorted({qi for qi, _ in request.pairs})
    used_d = sorted({di for _, di in request.pairs})
    limit = engine.processor.max_length_for(truncation)
    with tokenizing():
        queries = engine.processor.process([request.queries[i] for i in used_q],
                                           truncation=truncation)
        documents = engine.processor.process([request.documents[j] for j in used_d],
                                             whole=True)
        if max_tokens_per_doc is not None:
            documents = [long_inputs.cut_content(d, max_tokens_per_doc) for d in documents]
    groups = []
    for doc in documents:
        num_special = sum(doc.special_tokens_mask or [])
        room = limit - num_special
        step_overlap = long_inputs.scoring_overlap(overlap, room)
        groups.append(long_inputs.split_into_windows(doc, limit, step_overlap).inputs
                      if len(doc.prompt_token_ids) > limit else [doc])
    flat = queries + [w for group in groups for w in group]
    params = engine.verify_params(PoolingParams(task="embed"))
    results = engine.run_processed(flat, [params] * len(flat), priority, use_tqdm,
                                   cancel=cancel)
    vectors = np.stack([as_numpy(r.data) for r in results])  # [queries + windows, dim]
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    q_row = {qi: n for n, qi in enumerate(used_q)}
    d_rows, d_tokens, row = {}, {}, len(queries)
    for dj, group in zip(used_d, groups):
        d_rows[dj] = list(range(row, row + len(group)))
        d_tokens[dj] = sum(len(w.prompt_token_ids) for w in group)
        row += len(group)
    scores = [long_inputs.aggregate([float(vectors[q_row[qi]] @ vectors[r]) for r in d_rows[di]],
                                    aggregate) for qi, di in request.pairs]
    q_len = {qi: len(q.prompt_token_ids) for qi, q in zip(used_q, queries)}
    return (scores, pair_tokens(request.pairs, [d_tokens[di] for _, di in request.pairs],
                                lambda qi: q_len[qi]),
            [len(d_rows[di]) for _, di in request.pairs])


def late_interaction_window_scores(engine: TaskEngine, request: ScoreRequest,
                                   overlap: int | None, use_tqdm, priority,
                                   cancel) -> WindowedScores:
    """ColBERT: MaxSim of each query over the token vectors of all its document's windows."""
    builder = engine.colbert_inputs
    used_q = sorted({qi for qi, _ in request.pairs})
    used_d = sorted({di for _, di in request.pairs})
    with tokenizing():
        queries = builder.build([request.queries[i] for i in used_q], "query")
        groups = [builder.build_document_windows(request.documents[j], overlap)
                  for j in used_d]
    flat = queries + [w for group in groups for w in group]
    roles = ["query"] * len(queries) + ["document"] * (len(flat) - len(queries))
    params = [engine.verify_params(PoolingParams(task="token_embed", extra={
        ROLE_KEY: role, UNATTENDED_KEY: int(item.extra.get(UNATTENDED_KEY, 0))}))
        for item, role in zip(flat, roles)]
    results = engine.run_processed(flat, params, priority, use_tqdm, cancel=cancel)
    q_vectors = {qi: as_numpy(r.data) for qi, r in zip(used_q, results)}  # [q_len, dim]
    d_vectors, row = {}, len(queries)
    for dj, group in zip(used_d, groups):
        # The document's windows' token vectors, concatenated: [sum of window lengths, dim]
        d_vectors[dj] = np.concatenate([as_numpy(r.data) for r in results[row:row + len(group)]])
        row += len(group)
    scores = []
    for qi, di in request.pairs:
        if d_vectors[di].shape[0] == 0:  # nothing left to match (every token dropped)
            scores.append(0.0)
            continue
        sim = q_vectors[qi].astype(np.float32) @ d_vectors[di].T  # [q_len, doc tokens]
        scores.append(float(sim.max(axis=1).sum()))
    q_len = {qi: len(q.prompt_token_ids) for qi, q in zip(used_q, queries)}
    d_len = {dj: sum(len(w.prompt_token_ids) for w in g) for dj, g in zip(used_d, groups)}
    windows = {dj: len(g) for dj, g in zip(used_d, groups)}
    return (scores, pair_tokens(request.pairs, [d_len[di] for _, di in request.pairs],
                                lambda qi: q_len[qi]),
            [windows[di] for _, di in request.pairs])
