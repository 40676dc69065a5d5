"""vLLM-compatible routes: /pooling, /classify, /score, /v1/score, /tokenize, /detokenize.
(/rerank, /v1/rerank, /v2/rerank are in rerank.py.)

/tokenize is shared with TEI: a body with `inputs` is TEI's request, one with `prompt` is
vLLM's.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Body, Request

from pooler.params import PoolingParams
from pooler.server import tei
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import (ClassificationRequest, ClassificationResponse,
                                    DetokenizeRequest, DetokenizeResponse, PoolingRequest,
                                    PoolingResponse, ScoreRequest, ScoreResponse,
                                    TEITokenizeRequest, TokenizeRequest, TokenizeResponse)
from pooler.server.state import ServerState, usage, vector

router = APIRouter(tags=["vLLM"])


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


def _envelope(prefix: str, state: ServerState, data: list, num_tokens: int | None) -> dict:
    body = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": state.model_name, "data": data}
    if num_tokens is not None:
        body["usage"] = usage(num_tokens)
    return body


def _num_tokens(outputs) -> int:
    return sum(int(getattr(o, "num_tokens", 0) or 0) for o in outputs)


@router.post("/pooling", response_model=PoolingResponse, responses=ERROR_RESPONSES)
async def pooling(body: PoolingRequest, request: Request):
    """Any pooling task's raw output: embed (vector), classify (probabilities), token_embed
    (one vector per token), token_classify (probabilities per token)."""
    state = get_state(request)
    state.check_model(body.model)
    task = body.task or state.engine.default_task
    state.require("encode", task, f"the {task!r} task")
    items = state.inputs(body.input, "input")
    state.check_dimensions(body.dimensions, task)
    truncation = state.truncation(body)
    params = PoolingParams(task=task, dimensions=body.dimensions, normalize=body.normalize,
                           use_activation=body.use_activation)

    def compute():
        outputs = state.engine.encode(items, params, use_tqdm=False, **truncation)
        data = [{"index": i, "object": "pooling", "data": vector(o.data, body.encoding_format)}
                for i, o in enumerate(outputs)]
        return _envelope("pool", state, data, _num_tokens(outputs))

    return await state.respond(request, len(items), "input", compute)


@router.post("/classify", response_model=ClassificationResponse, responses=ERROR_RESPONSES)
async def classify(body: ClassificationRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    state.require("classify", "classify", "classification")
    items = state.inputs(body.input, "input")
    truncation = state.truncation(body, only_set=True)

    def compute():
        outputs = state.call("classify", items, use_activation=body.use_activation,
                             use_tqdm=False, **truncation)
        data = [{"index": i, "object": "classification", "label": o.label,
                 "probs": [float(p) for p in o.probs], "num_classes": len(o.probs)}
                for i, o in enumerate(outputs)]
        return _envelope("classify", state, data, _num_tokens(outputs))

    return await state.respond(request, len(items), "input", compute)


def _texts(value, field: str) -> list[str] | str:
    if isinstance(value, list) and not value:
        raise bad_request(f"'{field}' is empty: pass at least one text.", field)
    return value


async def _score(body: ScoreRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    state.require("score", None, "scoring")
    queries = body.queries if body.queries is not None else body.text_1
    documents = body.documents if body.documents is not None else body.text_2
    if queries is None:
        raise bad_request("Missing 'queries' (or 'text_1').", "queries")
    if documents is None:
        raise bad_request("Missing 'documents' (or 'text_2').", "documents")
    queries, documents = _texts(queries, "queries"), _texts(documents, "documents")
    n_q = 1 if isinstance(queries, str) else len(queries)
    n_d = 1 if isinstance(documents, str) else len(documents)
    if n_q > 1 and n_d != n_q:
        raise bad_request(f"Got {n_q} queries and {n_d} documents: pass one query with any "
                          "number of documents, or as many queries as documents.", "documents")

    def compute():
        outputs = state.call("score", queries, documents, use_tqdm=False)
        data = [{"index": i, "object": "score", "score": float(o.score)}
                for i, o in enumerate(outputs)]
        return _envelope("score", state, data, _num_tokens(outputs))

    return await state.respond(request, n_q + n_d, "documents", compute)


@router.post("/score", response_model=ScoreResponse, responses=ERROR_RESPONSES)
async def score(body: ScoreRequest, request: Request):
    return await _score(body, request)


@router.post("/v1/score", response_model=ScoreResponse, responses=ERROR_RESPONSES)
async def score_v1(body: ScoreRequest, request: Request):
    return await _score(body, request)


_TOKENIZE_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [TokenizeRequest.model_json_schema(),
                         TEITokenizeRequest.model_json_schema()]}}}}}


@router.post("/tokenize", responses=ERROR_RESPONSES, openapi_extra=_TOKENIZE_BODY)
async def tokenize(request: Request, body: dict[str, Any] = Body(...)):
    """vLLM's {prompt, add_special_tokens} -> {count, max_model_len, tokens}; TEI's
    {inputs, add_special_tokens} -> [[{id, text, special, start, stop}]]."""
    if "inputs" in body:
        return await tei.tokenize_tei(body, request)
    req = TokenizeRequest.model_validate(body)
    state = get_state(request)
    state.check_model(req.model)
    tokenizer = state.engine.tokenizer

    def compute():
        ids = tokenizer.encode_batch([req.prompt],
                                     add_special_tokens=req.add_special_tokens)[0].input_ids
        out = {"count": len(ids), "max_model_len": state.engine.model_config.max_model_len,
               "tokens": ids}
        if req.return_token_strs:
            out["token_strs"] = [tokenizer.id_to_token(t) for t in ids]
        return out

    return await state.respond(request, 1, "prompt", compute)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    tei.check_token_ids(state, body.tokens, "tokens")

    def compute():
        return {"prompt": state.engine.tokenizer.decode(body.tokens,
                                                       skip_special_tokens=False)}

    return await state.respond(request, 1, "tokens", compute)
