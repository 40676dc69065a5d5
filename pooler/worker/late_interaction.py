"""Late interaction (ColBERT): a query cache and MaxSim scoring, composed into the pooling runner.

A scoring request runs in two stages (ColBERT token vectors, or BGE-M3's three outputs). Each query runs once as `cache_query`: its token vectors
are copied into the cache with a number of uses (one per document to score against it). Each
document runs as `score_doc`: its token vectors are scored by MaxSim against the cached query
and the document's output becomes that 0-d score. Every document releases exactly one use,
whether it is scored, fails, or is aborted; the last use frees the entry.

Lifecycle rules (the model runner keeps them):
- a document registered with the runner and finished without being scored (aborted, failed)
  releases its use in `on_requests_finished`; a scored document has already released it;
- a preempted document is not "finished": it keeps its reservation until it runs again;
- a document aborted before it was ever scheduled was never registered: the scheduler hands
  its params over (`release_unscheduled`) and its use is released from those;
- `clear()` (weight reload) drops everything; keys are unique per scoring request, so dropping
  a key is always safe and releasing a missing key is a no-op.

All methods are called from the thread that steps the engine (or under its step lock).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from pooler.params import LateInteractionParams, PoolingParams

# Document tokens scored per matmul: bounds the [chunk, query_len] similarity buffer however
# long or numerous the documents of a step are.
MAXSIM_CHUNK_TOKENS = 16384


@dataclass
class _CachedQuery:
    # ColBERT: [query_len, dim]; BGE-M3: {"dense", "sparse", "colbert"}; private copies.
    embeddings: torch.Tensor | dict[str, torch.Tensor]
    uses: int                 # documents still to score (or release) against it


class LateInteractionRunner:
    def __init__(self, chunk_tokens: int = MAXSIM_CHUNK_TOKENS):
        self.chunk_tokens = chunk_tokens
        self._queries: dict[str, _CachedQuery] = {}
        self._doc_keys: dict[str, str] = {}  # registered, not yet scored doc req_id -> key
        self._cached_bytes = 0  # bytes of the cached query tensors

    # ---- inspection (tests, metrics) ----------------------------------------------------
    @property
    def num_cached_queries(self) -> int:
        return len(self._queries)

    @property
    def num_pending_docs(self) -> int:
        return len(self._doc_keys)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def query_uses(self, key: str) -> int | None:
        entry = self._queries.get(key)
        return None if entry is None else entry.uses

    # ---- lifecycle ----------------------------------------------------------------------
    def register_request(self, req_id: str, pooling_params: PoolingParams) -> None:
        li = _late_interaction_of(pooling_params)
        if li is not None and li.mode == "score_doc":
            self._doc_keys[req_id] = li.query_key
        else:  # a non-doc (re-)registration under this id clears any doc record
            self._doc_keys.pop(req_id, None)

    def on_requests_finished(self, req_ids) -> None:
        """Docs that finished without being scored (aborted, failed) release their use."""
        for req_id in req_ids:
            key = self._doc_keys.pop(req_id, None)
            if key is not None:
                self._release(key)

    def release_unscheduled(self, aborted: Mapping[str, PoolingParams]) -> None:
        """Requests aborted before they were ever scheduled: the runner never registered them,
        so a doc's use is released from its params here."""
        for req_id, params in aborted.items():
            if req_id in self._doc_keys:  # registered after all: the finished path owns it
                continue
            li = _late_interaction_of(params)
            if li is not None and li.mode == "score_doc":
                self._release(li.query_key)

    def drop_queries(self, keys) -> None:
        """Forget cached queries whose documents will never run (a scoring request that was
        cancelled or failed before its document stage)."""
        for key in keys:
            self._forget(key)

    def clear(self) -> None:
        self._queries.clear()
        self._doc_keys.clear()
        self._cached_bytes = 0

    def _forget(self, key: str) -> None:
        entry = self._queries.pop(key, None)
        if entry is not None:
            self._cached_bytes -= _nbytes(entry.embeddings)

    def _release(self, key: str) -> None:
        entry = self._queries.get(key)
        if entry is None:
            return  # dropped or cleared already
        entry.uses -= 1
        if entry.uses <= 0:
            self._forget(key)

    # ---- after the pooler ---------------------------------------------------------------
    def postprocess_pooler_output(
            self, raw_pooler_output: list[torch.Tensor | None],
            pooling_params: list[PoolingParams], req_ids: list[str],
            finished_mask: list[bool]) -> tuple[list[torch.Tensor | None], dict[str, str]]:
        """Cache finished queries, score finished docs; returns (outputs, per-request errors).

        State changes are committed only at the end, so an exception leaves the cache as it
        was and the scheduler can retry the batch."""
        outputs = list(raw_pooler_output)
        errors: dict[str, str] = {}
        new_queries: dict[str, _CachedQuery] = {}
        docs: list[tuple[int, str]] = []  # (index in batch, query key)
        for i, (params, req_id, finished) in enumerate(
                zip(pooling_params, req_ids, finished_mask)):
            li = _late_interaction_of(params)
            if li is None or not finished:
                continue
            if li.mode == "cache_query":
                if li.query_key in self._queries or li.query_key in new_queries:
                    errors[req_id] = (f"late_interaction.query_key {li.query_key!r} is already "
                                      "cached; every query needs its own key.")
                    outputs[i] = None
                    continue
                vectors = raw_pooler_output[i]  # [query_len, dim], maybe a view into a buffer
                if isinstance(vectors, dict):  # BGE-M3
                    copy = {name: t.detach().clone() for name, t in vectors.items()}
                    vectors = copy["colbert"]
                else:
                    copy = vectors.detach().clone()
                new_queries[li.query_key] = _CachedQuery(copy, int(li.query_uses or 1))
                outputs[i] = torch.zeros((), dtype=vectors.dtype, device=vectors.device)
            else:
                docs.append((i, li.query_key))

        scored: list[tuple[str, str]] = []  # (req_id, key) of docs that consumed a use
        by_key: dict[str, list[int]] = {}
        for i, key in docs:
            if key in self._queries:
                by_key.setdefault(key, []).append(i)
            else:
                errors[req_ids[i]] = (
                    f"late_interaction: query {key!r} is not cached. Queries must run (with "
                    "mode='cache_query') and finish before their documents (mode='score_doc').")
                outputs[i] = None
        for key, indices in by_key.items():
            query = self._queries[key].embeddings
            docs_out = [raw_pooler_output[i] for i in indices]
            scores = (bge_m3_scores(query, docs_out, self.chunk_tokens)
                      if isinstance(query, dict) else maxsim(query, docs_out, self.chunk_tokens))
            for i, score in zip(indices, scores):
                outputs[i] = score
                scored.append((req_ids[i], key))

        # Commit.
        for key, entry in new_queries.items():
            self._forget(key)  # never double-count a key (the step rejects duplicates anyway)
            self._queries[key] = entry
            self._cached_bytes += _nbytes(entry.embeddings)
        for req_id, key in scored:
            self._doc_keys.pop(req_id, None)
            self._release(key)
        for i, key in docs:  # an unscored doc of this step fails now: release its use once
            req_id = req_ids[i]
            if req_id in errors and self._doc_keys.pop(req_id, None) is not None:
                self._release(key)
        return outputs, errors


def maxsim(query: torch.Tensor, docs: list[torch.Tensor],
           chunk_tokens: int = MAXSIM_CHUNK_TOKENS) -> list[torch.Tensor]:
    """MaxSim of one query against many documents, without padding any of them.

    query: [query_len, dim]; docs: [doc_len_i, dim] each. The documents are packed into one
    [total_tokens, dim] matrix and scored chunk by chunk, so memory is bounded by
    chunk_tokens x query_len whatever the documents' lengths. Returns one 0-d score per doc:
    sum over query tokens of the max dot product over that document's tokens."""
    lengths = [d.shape[0] for d in docs]
    device = query.device
    q = query.float()                                                   # [Lq, dim]
    packed = torch.cat(docs).float() if len(docs) > 1 else docs[0].float()  # [T, dim]
    seg = torch.repeat_interleave(torch.arange(len(docs), device=device),
                                  torch.tensor(lengths, device=device))  # [T]
    best = torch.full((len(docs), q.shape[0]), float("-inf"), device=device)  # [D, Lq]
    for start in range(0, packed.shape[0], chunk_tokens):
        sim = packed[start:start + chunk_tokens] @ q.T                  # [chunk, Lq]
        index = seg[start:start + chunk_tokens, None].expand_as(sim)
        best.scatter_reduce_(0, index, sim, reduce="amax", include_self=True)
    best = torch.where(torch.isinf(best), torch.zeros_like(best), best)  # empty docs score 0
    return list(best.sum(dim=-1).unbind(0))  # float32 whatever the model dtype


def bge_m3_scores(query: dict[str, torch.Tensor], docs: list[dict[str, torch.Tensor]],
                  chunk_tokens: int = MAXSIM_CHUNK_TOKENS) -> list[torch.Tensor]:
    """BGE-M3's three scores of each document, as FlagEmbedding's compute_score: dense dot
    product, dot product of the lexical weights ([vocab] each), ColBERT MaxSim averaged over
    the query's vectors. Returns one [3] tensor (dense, sparse, colbert) per document."""
    colbert = torch.stack(maxsim(query["colbert"], [d["colbert"] for d in docs], chunk_tokens))
    colbert = colbert / max(query["colbert"].shape[0], 1)                   # [D]
    dense = torch.stack([d["dense"] for d in docs]).float() @ query["dense"].float()     # [D]
    sparse = torch.stack([d["sparse"] for d in docs]).float() @ query["sparse"].float()  # [D]
    return list(torch.stack([dense, sparse, colbert.float()], dim=1).unbind(0))


def _nbytes(cached: torch.Tensor | dict[str, torch.Tensor]) -> int:
    """Bytes of a cached query: one tensor (ColBERT), or BGE-M3's dense/sparse/colbert."""
    tensors = cached.values() if isinstance(cached, dict) else (cached,)
    return sum(t.numel() * t.element_size() for t in tensors)


def _late_interaction_of(params: PoolingParams | None) -> LateInteractionParams | None:
    li = getattr(params, "late_interaction", None)
    if li is None:
        return None
    if not isinstance(li, LateInteractionParams):
        raise ValueError("pooling_params.late_interaction must be a LateInteractionParams, "
                         f"got {type(li).__name__}.")
    li.verify()
    return li
