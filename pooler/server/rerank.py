"""Rerank routes in the Cohere / Jina / vLLM shape: POST /rerank, /v1/rerank, /v2/rerank.

{query, documents, top_n, return_documents} -> {id, model, usage, results[{index,
relevance_score, document?: {text}}]} sorted best first.

POST /rerank is also TEI's rerank path: a body with `texts` (TEI) is answered in TEI's shape
([{index, score, text?}]), a body with `documents` in Cohere's.
"""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Body, Request

from pooler.server import tei
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import RerankRequest, RerankResponse, TEIRerankRequest
from pooler.server.state import ServerState

router = APIRouter(tags=["Rerank (Cohere, Jina, vLLM)"])


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


def _document_texts(documents: list) -> list[str]:
    """Cohere v1 also takes documents as {"text": ...} objects."""
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc.get("text"), str):
            texts.append(doc["text"])
        else:
            raise bad_request(f"documents[{i}] must be a string or an object with a string "
                              "'text' field.", "documents")
    return texts


async def _rerank(body: RerankRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    state.require("rerank", None, "reranking")
    if not body.documents:
        raise bad_request("'documents' is empty: pass at least one document.", "documents")
    if body.top_n is not None and body.top_n <= 0:
        raise bad_request(f"top_n must be a positive integer, got {body.top_n}.", "top_n")
    documents = _document_texts(body.documents)
    top_n = None if body.top_n is None else min(body.top_n, len(documents))

    def compute():
        results = state.call("rerank", body.query, documents, top_n=top_n,
                             return_documents=body.return_documents, use_tqdm=False)
        ranked = sorted(results, key=lambda r: -float(r.score))[:top_n]
        items = []
        for r in ranked:
            item: dict[str, Any] = {"index": int(r.index), "relevance_score": float(r.score)}
            if body.return_documents:
                item["document"] = {"text": documents[r.index]}
            items.append(item)
        tokens = [getattr(r, "num_tokens", None) for r in results]
        total = sum(tokens) if tokens and all(t is not None for t in tokens) else None
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": state.model_name,
                "results": items, "usage": {"total_tokens": total}}

    return await state.respond(request, len(documents) + 1, "documents", compute)


_RERANK_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [RerankRequest.model_json_schema(),
                         TEIRerankRequest.model_json_schema()]}}}}}


@router.post("/rerank", responses=ERROR_RESPONSES, openapi_extra=_RERANK_BODY)
async def rerank(request: Request, body: dict[str, Any] = Body(...)):
    """Cohere/Jina/vLLM body ({query, documents}) or TEI body ({query, texts})."""
    if "texts" in body and "documents" not in body:
        return await tei.rerank_tei(body, request)
    return await _rerank(RerankRequest.model_validate(body), request)


@router.post("/v1/rerank", response_model=RerankResponse, responses=ERROR_RESPONSES)
async def rerank_v1(body: RerankRequest, request: Request):
    return await _rerank(body, request)


@router.post("/v2/rerank", response_model=RerankResponse, responses=ERROR_RESPONSES)
async def rerank_v2(body: RerankRequest, request: Request):
    return await _rerank(body, request)
