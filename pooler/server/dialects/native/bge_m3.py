"""BGE-M3 routes: every output of one forward pass, and every score of FlagEmbedding's
compute_score. (`/rerank`, `/score` and `/v1/embeddings` also serve BGE-M3: the combined
"colbert+sparse+dense" score with weights [1, 1, 1], and the dense vector.)

POST /bge_m3/embed  {"input": texts, "outputs": ["dense", "sparse", "colbert"]}
  -> data[{index, dense?: [...], sparse?: {token_id: weight}, colbert?: [[...], ...]}]
POST /bge_m3/score  {"queries": text or texts, "documents": texts, "weights": [d, s, c]}
  -> data[{index, query_index, document_index, dense, sparse, colbert, "sparse+dense",
           "colbert+sparse+dense"}]
"""
from __future__ import annotations

import time
import uuid
from typing import Optional, Union

from fastapi import APIRouter, Request
from pydantic import BaseModel, StrictFloat, StrictInt, StrictStr

from pooler.bge_m3_layout import check_outputs, check_weights
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import Inputs, NullMeansUnset
from pooler.server.state import ServerState, usage

router = APIRouter(tags=["BGE-M3"])


class BGEM3EmbedRequest(NullMeansUnset):
    input: Inputs
    outputs: list[StrictStr] = ["dense", "sparse", "colbert"]
    model: Optional[StrictStr] = None
    truncate: bool = True


class BGEM3ScoreRequest(NullMeansUnset):
    queries: Union[StrictStr, list[StrictStr]]
    documents: Union[StrictStr, list[StrictStr]]
    weights: Optional[list[Union[StrictFloat, StrictInt]]] = None
    model: Optional[StrictStr] = None
    truncate: bool = True


def _state(request: Request) -> ServerState:
    state = request.app.state.pooler
    if getattr(state.engine.model_config, "bge_m3", None) is None:
        raise bad_request("this model is not a BGE-M3 model (no colbert_linear.pt and "
                          "sparse_linear.pt beside its checkpoint).", "model")
    return state


def _envelope(prefix: str, state: ServerState, data: list, num_tokens: int) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": "list",
            "created": int(time.time()), "model": state.model_name, "data": data,
            "usage": usage(num_tokens)}


@router.post("/bge_m3/embed", responses=ERROR_RESPONSES)
async def embed(body: BGEM3EmbedRequest, request: Request):
    """Any of BGE-M3's dense vector, lexical weights and ColBERT vectors, from one pass."""
    state = _state(request)
    state.check_model(body.model)
    items = state.inputs(body.input, "input")
    try:
        outputs = check_outputs(body.outputs)
    except ValueError as exc:
        raise bad_request(str(exc), "outputs") from None

    def compute():
        results = state.engine.embed_bge_m3(items, outputs=outputs, truncate=body.truncate,
                                            use_tqdm=False)
        data = []
        for i, r in enumerate(results):
            row = {"index": i, "object": "bge_m3"}
            if r.dense is not None:
                row["dense"] = r.dense.tolist()
            if r.sparse is not None:
                row["sparse"] = {str(k): v for k, v in r.sparse.to_dict().items()}
            if r.colbert is not None:
                row["colbert"] = r.colbert.tolist()
            data.append(row)
        return _envelope("m3", state, data, sum(r.num_tokens for r in results))

    return await state.respond(request, len(items), "input", compute)


@router.post("/bge_m3/score", responses=ERROR_RESPONSES)
async def score(body: BGEM3ScoreRequest, request: Request):
    """FlagEmbedding's compute_score for 1 query x N documents, or N x N pairwise."""
    state = _state(request)
    state.check_model(body.model)
    queries = state.inputs(body.queries, "queries")
    documents = state.inputs(body.documents, "documents")
    try:
        check_weights(body.weights)
    except ValueError as exc:
        raise bad_request(str(exc), "weights") from None
    if len(queries) > 1 and len(queries) != len(documents):
        raise bad_request(f"Got {len(queries)} queries and {len(documents)} documents: pass "
                          "one query with any number of documents, or as many queries as "
                          "documents.", "documents")

    def compute():
        results = state.engine.score_bge_m3(queries, documents, weights=body.weights,
                                            truncate=body.truncate, use_tqdm=False)
        data = [{"index": i, "object": "bge_m3_score", "query_index": r.query_index,
                 "document_index": r.document_index, "dense": r.dense, "sparse": r.sparse,
                 "colbert": r.colbert, "sparse+dense": r.sparse_dense,
                 "colbert+sparse+dense": r.colbert_sparse_dense}
                for i, r in enumerate(results)]
        return _envelope("m3score", state, data, 0)

    return await state.respond(request, len(queries) + len(documents), "documents", compute)
