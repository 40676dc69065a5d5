"""Scoring routes in vLLM's shape (also what Cohere's and Jina's rerank clients read):
POST /rerank, /v1/rerank, /v2/rerank, and the /score handler routes.py routes to.

{query, documents, top_n} -> {id, model, usage{prompt_tokens, total_tokens}, results[{index,
document{text}, relevance_score}]}, best first; top_n 0 (the default) keeps every document.
As vLLM: an over-long pair is a 400 unless truncation is asked for (truncate_prompt_tokens,
-1 for the model's maximum), max_tokens_per_doc cuts documents first, use_activation=false
gives raw logits, and the routes answer 404 on models vLLM would not score with.

POST /rerank is also TEI's rerank path: a body with `texts` (TEI) is answered in TEI's shape
([{index, score, text?}]), a body with `documents` in vLLM's.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse

from pooler.server.dialects import tei
from pooler.server.dialects.long_documents import long_document_options, with_windows
from pooler.server.dialects.vllm.common import (TRUNCATION_TOO_BIG, check_priority, envelope,
                                                get_state, response_id, scoring_unavailable_reason)
from pooler.server.dialects.vllm.errors import VLLMRoute, use_tei_errors, vllm_error
from pooler.server.dialects.vllm.protocol import (RerankRequest, RerankResponse,
                                                  ScoreMultiModal, ScoreRequest, ScoreResponse)
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.media import content_item
from pooler.server.protocol import TEIRerankRequest, part_dicts
from pooler.server.state import ServerState

router = APIRouter(tags=["Rerank (vLLM, Cohere, Jina)"], route_class=VLLMRoute)

__all__ = ["router", "score", "rerank_vllm", "ScoreResponse"]


def _not_served(state: ServerState, path: str) -> JSONResponse | None:
    reason = scoring_unavailable_reason(state)
    if reason is None:
        return None
    # vLLM does not register the route: FastAPI's {"detail": "Not Found"}, plus why.
    return vllm_error(404, f"{path} is not served for this model: {reason}.",
                      extra={"detail": "Not Found"})


def _scoring_options(state: ServerState, body) -> dict[str, Any]:
    limit = body.truncate_prompt_tokens
    max_len = state.engine.model_config.max_model_len
    if limit is not None and limit > max_len:
        raise bad_request(TRUNCATION_TOO_BIG, "truncate_prompt_tokens")
    if limit is not None and limit != -1 and limit < state.min_truncation():
        raise bad_request(f"truncate_prompt_tokens must be -1 or at least "
                          f"{state.min_truncation()} (the special tokens plus one), got "
                          f"{limit}.", "truncate_prompt_tokens")
    if body.max_tokens_per_doc is not None and body.max_tokens_per_doc <= 0:
        raise bad_request(f"max_tokens_per_doc must be a positive integer, got "
                          f"{body.max_tokens_per_doc}.", "max_tokens_per_doc")
    cross_encoder = state.engine.model_config.colbert is None \
        and "classify" in state.engine.supported_tasks
    if body.max_tokens_per_doc is not None and not cross_encoder \
            and body.max_tokens_per_doc < state.min_truncation():
        # A bi-encoder encodes the document alone, its special tokens included.
        raise bad_request(f"max_tokens_per_doc must be at least {state.min_truncation()} on "
                          "this model (a document keeps its special tokens plus one), got "
                          f"{body.max_tokens_per_doc}.", "max_tokens_per_doc")
    # truncate_prompt_tokens asks for truncation (vLLM), whatever `truncate` says.
    truncate = True if limit is not None else bool(body.truncate)
    options: dict[str, Any] = {"truncate": truncate,
                               "truncate_prompt_tokens": None if limit == -1 else limit}
    if body.use_activation is not None:
        options["use_activation"] = body.use_activation
    if body.max_tokens_per_doc is not None:
        options["max_tokens_per_doc"] = body.max_tokens_per_doc
    options.update(long_document_options(body))
    return options


def _side(state: ServerState, value, field: str):
    """One side of /score as Engine items: a string stays a string; a ScoreMultiModalParam
    ({"content": [parts]}) becomes its text, its image (a media.ImageRef) or both
    (pooler/server/media.py: content_item)."""
    if isinstance(value, list) and not value:
        raise bad_request(f"'{field}' is empty: pass at least one text.", field)
    if isinstance(value, ScoreMultiModal):
        return [content_item(state.engine, part_dicts(value.content), f"{field}.content")]
    if isinstance(value, list):
        return [content_item(state.engine, part_dicts(v.content), f"{field}[{i}].content")
                if isinstance(v, ScoreMultiModal) else v for i, v in enumerate(value)]
    return value


async def score(body: ScoreRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    check_priority(body)
    not_served = _not_served(state, request.url.path)
    if not_served is not None:
        return not_served
    queries, documents, doc_field = body.sides()
    queries, documents = _side(state, queries, "queries"), _side(state, documents, doc_field)
    # The 1:1 / 1:N / N:N shape is checked with the request (ScoreRequest._one_spelling).
    n_q = 1 if isinstance(queries, str) else len(queries)
    n_d = 1 if isinstance(documents, str) else len(documents)
    options = _scoring_options(state, body)
    if not isinstance(queries, str) or not isinstance(documents, str):
        # Both sides' images fetched and decoded together, in parallel.
        q_list = [queries] if isinstance(queries, str) else queries
        d_list = [documents] if isinstance(documents, str) else documents
        both, _ = await state.resolve_images(q_list + d_list)
        queries = queries if isinstance(queries, str) else both[:len(q_list)]
        documents = documents if isinstance(documents, str) else both[len(q_list):]

    def compute():
        outputs = state.call("score", queries, documents, use_tqdm=False, **options)
        data = [with_windows({"index": i, "object": "score", "score": float(o.score)}, o)
                for i, o in enumerate(outputs)]
        return envelope("score", state, body, data, sum(o.num_tokens for o in outputs))

    return await state.respond(request, n_q + n_d, doc_field, compute)


def _documents(state: ServerState, documents) -> tuple[list, list[dict]]:
    """Engine items and the `document` each result echoes: a string, Cohere v1's {"text": ...}
    ({"text": ...}), or vLLM's {"content": [parts]} (its item from media.content_item;
    {"multi_modal": parts})."""
    if isinstance(documents, str):
        return [documents], [{"text": documents}]
    if isinstance(documents, ScoreMultiModal):
        parts = part_dicts(documents.content)
        return ([content_item(state.engine, parts, "documents.content")],
                [{"multi_modal": parts}])
    items, echoes = [], []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            items.append(doc)
            echoes.append({"text": doc})
        elif isinstance(doc, ScoreMultiModal):
            parts = part_dicts(doc.content)
            items.append(content_item(state.engine, parts, f"documents[{i}].content"))
            echoes.append({"multi_modal": parts})
        elif isinstance(doc.get("content"), list):
            items.append(content_item(state.engine, doc["content"], f"documents[{i}].content"))
            echoes.append({"multi_modal": doc["content"]})
        elif isinstance(doc.get("text"), str):
            items.append(doc["text"])
            echoes.append({"text": doc["text"]})
        else:
            raise bad_request(f"documents[{i}] must be a string, an object with a string "
                              "'text' field, or {'content': [parts]} (text and image_url "
                              "parts).", "documents")
    return items, echoes


async def rerank_vllm(body: RerankRequest, request: Request):
    # `model` may be any name: Cohere's and Jina's clients must send their own (e.g.
    # "rerank-v3.5"), and TEI serves /rerank whatever it says. With several models the
    # router picks by it (404 for a name it does not serve).
    state = get_state(request)
    check_priority(body)
    state.pick_lora(body.model)  # any name is accepted; a LoRA adapter's name picks it
    not_served = _not_served(state, request.url.path)
    if not_served is not None:
        return not_served
    documents, echoes = _documents(state, body.documents)
    if not documents:
        raise bad_request("'documents' is empty: pass at least one document.", "documents")
    top_n = body.top_n if 0 < body.top_n < len(documents) else len(documents)
    options = _scoring_options(state, body)
    query = body.query if isinstance(body.query, str) else \
        content_item(state.engine, part_dicts(body.query.content), "query.content")
    # The query's and the documents' images fetched and decoded together, in parallel.
    resolved, _ = await state.resolve_images([query] + documents)
    query, documents = resolved[0], resolved[1:]

    def compute():
        outputs = state.call("score", query, documents, use_tqdm=False, **options)
        ranked = sorted(outputs, key=lambda o: (-o.score, o.document_index))[:top_n]
        results = []
        for o in ranked:
            item: dict[str, Any] = {"index": int(o.document_index)}
            if body.return_documents is not False:
                item["document"] = echoes[o.document_index]
            item["relevance_score"] = float(o.score)
            results.append(with_windows(item, o))
        tokens = sum(o.num_tokens for o in outputs)
        return {"id": response_id("rerank", body), "model": state.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "results": results}

    return await state.respond(request, len(documents) + 1, "documents", compute)


_RERANK_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [RerankRequest.model_json_schema(),
                         TEIRerankRequest.model_json_schema()]}}}}}


# The TEI body on a model that is not a cross-encoder is TEI's 424.
@router.post("/rerank", responses={**ERROR_RESPONSES, 424: tei._TEI_ERRORS[424]},
             openapi_extra=_RERANK_BODY)
async def rerank(request: Request, body: dict[str, Any] = Body(...)):
    """vLLM/Cohere/Jina body ({query, documents}) or TEI body ({query, texts})."""
    if "texts" in body and "documents" not in body:
        use_tei_errors(request)
        return await tei.rerank_tei(body, request)
    return await rerank_vllm(RerankRequest.model_validate(body), request)


@router.post("/v1/rerank", response_model=RerankResponse, responses=ERROR_RESPONSES)
async def rerank_v1(body: RerankRequest, request: Request):
    return await rerank_vllm(body, request)


@router.post("/v2/rerank", response_model=RerankResponse, responses=ERROR_RESPONSES)
async def rerank_v2(body: RerankRequest, request: Request):
    return await rerank_vllm(body, request)
