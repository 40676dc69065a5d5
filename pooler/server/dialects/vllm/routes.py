"""vLLM-compatible routes: /v1/embeddings, /pooling, /classify, /score, /v1/score, /tokenize,
/detokenize, /invocations (SageMaker). /rerank, /v1/rerank, /v2/rerank are in rerank.py.

Bodies, options and errors follow vLLM's pooling entrypoints (see protocol.py and
errors.py here): `messages` (chat) input, add_special_tokens, use_activation, embed_dtype x
endianness with base64 or binary ("bytes", "bytes_only") bodies.

/tokenize is shared with TEI: a body with `inputs` is TEI's request, one with `prompt` or
`messages` is vLLM's.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from fastapi import APIRouter, Body, Request
from pydantic import ValidationError

from pooler.params import PoolingParams
from pooler.server.dialects import quantized, tei
from pooler.server.dialects.vllm import rerank
from pooler.server.dialects.vllm.common import (check_priority, chat_token_ids, envelope, get_state,
                                                prompt_inputs, require_task, response_id,
                                                scoring_unavailable_reason, truncation_options,
                                                vllm_usage)
from pooler.server.dialects.vllm.encoding import binary_response, encode_vector
from pooler.server.dialects.vllm.errors import VLLMRoute, use_tei_errors
from pooler.server.dialects.vllm.protocol import (ClassificationRequest, ClassificationResponse,
                                                  DetokenizeRequest, DetokenizeResponse,
                                                  EmbeddingRequest, EmbeddingResponse,
                                                  PoolingRequest, PoolingResponse, RerankRequest,
                                                  ScoreRequest, TokenizeRequest, TokenizeResponse)
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import TEITokenizeRequest
from pooler.server.state import ServerState

router = APIRouter(tags=["vLLM"], route_class=VLLMRoute)

# encoding_format "bytes"/"bytes_only": the vectors as a binary body (encoding.py).
ENCODED_RESPONSES = {**ERROR_RESPONSES, 200: {
    "description": "JSON, or raw vectors for encoding_format bytes / bytes_only",
    "content": {"application/octet-stream": {}}}}


def _encoded_body(prefix: str, state: ServerState, body, arrays: list, num_tokens: int,
                  key: str, obj: str):
    """The JSON list body (float or base64 per vector) or vLLM's binary body."""
    if body.encoding_format in ("bytes", "bytes_only"):
        head = {"id": response_id(prefix, body), "created": int(time.time()),
                "model": state.model_name, "usage": vllm_usage(num_tokens)}
        return binary_response(arrays, body.encoding_format, body.embed_dtype, body.endianness,
                               head)
    data = [{"index": i, "object": obj,
             key: encode_vector(a, body.encoding_format, body.embed_dtype, body.endianness)}
            for i, a in enumerate(arrays)]
    return envelope(prefix, state, body, data, num_tokens)


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ENCODED_RESPONSES)
async def create_embeddings(body: EmbeddingRequest, request: Request):
    """OpenAI's embeddings request plus vLLM's options (messages, use_activation,
    add_special_tokens, embed_dtype, endianness, truncate_prompt_tokens, ...).
    `model` may be any name, as on TEI's /v1/embeddings: a client set up for another server
    ("tei", "text-embedding-3-small") works unchanged on this single-model server (with
    several models, the router picks by it and answers 404 for a name it does not serve);
    a served LoRA adapter's name runs the request with that adapter."""
    state = get_state(request)
    check_priority(body)
    state.pick_lora(body.model)  # any name is accepted; a LoRA adapter's name picks it
    require_task(state, "embed", "embeddings")
    items, add_special = prompt_inputs(state, body)
    state.check_dimensions(body.dimensions)
    adapter = state.task_adapter(body.task)  # Jina's `task`: {} or {"task": name}
    truncation = truncation_options(state, body)
    quantized.check_request(body.precision, body.encoding_format, body.ranges,
                            body.dimensions or state.engine.embedding_size)

    long_input = body.long_input or state.settings.long_input
    chunking = {"long_input": "chunk", "chunk_overlap": body.chunk_overlap} \
        if long_input == "chunk" else {}
    if chunking and not add_special:
        raise bad_request("long_input 'chunk' puts the model's special tokens around every "
                          "window: it needs add_special_tokens true (or unset).",
                          "add_special_tokens")
    items, _ = await state.resolve_images(items)  # off the event loop, 400 naming a bad one

    def compute():
        outputs = state.engine.embed(items, dimensions=body.dimensions, normalize=body.normalize,
                                     use_activation=body.use_activation,
                                     prompt_name=body.prompt_name,
                                     add_special_tokens=add_special, use_tqdm=False,
                                     **truncation, **chunking, **adapter)
        tokens = sum(o.num_tokens for o in outputs)
        if body.precision != "float32":  # pooler's quantized vectors (issue 16)
            codes = quantized.quantize(np.stack([o.embedding for o in outputs]),
                                       body.precision, body.ranges)
            data = [{"index": i, "object": "embedding",
                     "embedding": quantized.encode(c, body.encoding_format)}
                    for i, c in enumerate(codes)]
            return envelope("embd", state, body, data, tokens)
        return _encoded_body("embd", state, body, [o.embedding for o in outputs], tokens,
                             "embedding", "embedding")

    return await state.respond(request, len(items), "input", compute)


@router.post("/embeddings", response_model=EmbeddingResponse, responses=ENCODED_RESPONSES,
             tags=["TEI"])
async def tei_embeddings(body: EmbeddingRequest, request: Request):
    """TEI's alias of the OpenAI route (/v1/embeddings): same body, same answer, TEI's error
    shape; `model` may be any name, as TEI ignores it. (Here rather than in dialects/tei.py: the
    vLLM routes import tei.py for the shared paths, so tei.py cannot import this handler.)"""
    use_tei_errors(request)
    return await create_embeddings(body.model_copy(update={"model": None}), request)


@router.post("/pooling", response_model=PoolingResponse, responses=ENCODED_RESPONSES)
async def pooling(body: PoolingRequest, request: Request):
    """Any pooling task's raw output: embed (vector), classify (probabilities), token_embed
    (one vector per token), token_classify (probabilities per token)."""
    state = get_state(request)
    state.check_model(body.model)
    check_priority(body)
    task = body.task or state.engine.default_task
    require_task(state, task, f"the {task!r} task")
    items, add_special = prompt_inputs(state, body)
    state.check_dimensions(body.dimensions, task)
    truncation = truncation_options(state, body)
    params = PoolingParams(task=task, dimensions=body.dimensions, normalize=body.normalize,
                           use_activation=body.use_activation)
    try:
        state.engine.verify_params(params)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if body.precision != "float32" and task not in ("embed", "token_embed"):
        raise bad_request(f"precision={body.precision!r} quantizes vectors: it applies to task "
                          f"'embed' or 'token_embed', not {task!r}. Drop 'precision' or "
                          "change 'task'.", "precision")
    # token_embed's vector size (e.g. a ColBERT projection) is only known from its output.
    quantized.check_request(body.precision, body.encoding_format, body.ranges,
                            (body.dimensions or state.engine.embedding_size)
                            if task == "embed" else None)
    items, _ = await state.resolve_images(items)

    def compute():
        outputs = state.engine.encode(items, params, add_special_tokens=add_special,
                                      use_tqdm=False, **truncation)
        tokens = sum(int(o.num_tokens) for o in outputs)
        if body.precision != "float32":  # pooler's quantized vectors (issue 16)
            # One request-independent code per value: each output (a vector, or a token
            # matrix [num_tokens, dim]) is quantized row by row with the same ranges.
            data = []
            for i, o in enumerate(outputs):
                rows = np.atleast_2d(np.asarray(o.data, dtype=np.float32))
                codes = quantized.quantize(rows, body.precision, body.ranges)
                codes = codes[0] if np.ndim(o.data) == 1 else codes
                data.append({"index": i, "object": "pooling",
                             "data": quantized.encode(codes, body.encoding_format)})
            return envelope("pool", state, body, data, tokens)
        return _encoded_body("pool", state, body, [o.data for o in outputs], tokens, "data",
                             "pooling")

    return await state.respond(request, len(items), "input", compute)


@router.post("/classify", response_model=ClassificationResponse, responses=ERROR_RESPONSES)
async def classify(body: ClassificationRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    check_priority(body)
    require_task(state, "classify", "classification")
    items, add_special = prompt_inputs(state, body)
    truncation = truncation_options(state, body)
    if truncation.pop("truncation_direction") != "right":
        raise bad_request("/classify truncates from the right only; leave truncation_side "
                          "unset.", "truncation_side")
    items, _ = await state.resolve_images(items)

    def compute():
        outputs = state.call("classify", items, use_activation=body.use_activation,
                             add_special_tokens=add_special, use_tqdm=False, **truncation)
        data = [{"index": i, "object": "classification", "label": o.label,
                 "probs": [float(p) for p in o.probs], "num_classes": len(o.probs)}
                for i, o in enumerate(outputs)]
        return envelope("classify", state, body, data, sum(o.num_tokens for o in outputs))

    return await state.respond(request, len(items), "input", compute)


@router.post("/score", response_model=rerank.ScoreResponse, responses=ERROR_RESPONSES)
async def score(body: ScoreRequest, request: Request):
    return await rerank.score(body, request)


@router.post("/v1/score", response_model=rerank.ScoreResponse, responses=ERROR_RESPONSES)
async def score_v1(body: ScoreRequest, request: Request):
    return await rerank.score(body, request)


_TOKENIZE_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [TokenizeRequest.model_json_schema(),
                         TEITokenizeRequest.model_json_schema()]}}}}}


@router.post("/tokenize", responses=ERROR_RESPONSES, openapi_extra=_TOKENIZE_BODY)
async def tokenize(request: Request, body: dict[str, Any] = Body(...)):
    """vLLM's {prompt | messages, add_special_tokens, return_token_strs} -> {count,
    max_model_len, tokens, token_strs}; TEI's {inputs, add_special_tokens} -> [[{id, text,
    special, start, stop}]]."""
    if "inputs" in body:
        use_tei_errors(request)
        return await tei.tokenize_tei(body, request)
    req = TokenizeRequest.model_validate(body)
    state = get_state(request)
    state.check_model(req.model)
    check_priority(req)
    tokenizer = state.engine.tokenizer
    if req.messages is not None:
        ids = chat_token_ids(state, req, bool(req.add_special_tokens))
    else:
        ids = None

    def compute():
        tokens = ids if ids is not None else tokenizer.encode_batch(
            [req.prompt], add_special_tokens=req.add_special_tokens is not False)[0].input_ids
        return {"count": len(tokens), "max_model_len": state.engine.model_config.max_model_len,
                "tokens": tokens,
                "token_strs": [tokenizer.id_to_token(t) for t in tokens]
                if req.return_token_strs else None}

    return await state.respond(request, 1, "prompt", compute, model_step=False)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    check_priority(body)
    if not body.tokens:
        raise bad_request("'tokens' is empty: pass at least one token id.", "tokens")
    tei.check_token_ids(state, body.tokens, "tokens")

    def compute():
        return {"prompt": state.engine.tokenizer.decode(body.tokens,
                                                       skip_special_tokens=False)}

    return await state.respond(request, 1, "tokens", compute, model_step=False)


def _invocation_handlers(state: ServerState) -> list[tuple[type, Any]]:
    """vLLM's order: embeddings, classification, rerank, score, pooling; each only where the
    model serves it."""
    tasks = state.engine.supported_tasks
    handlers: list[tuple[type, Any]] = []
    if "embed" in tasks:
        handlers.append((EmbeddingRequest, create_embeddings))
    if "classify" in tasks:
        handlers.append((ClassificationRequest, classify))
    if scoring_unavailable_reason(state) is None:
        handlers += [(RerankRequest, rerank.rerank_vllm), (ScoreRequest, score)]
    handlers.append((PoolingRequest, pooling))
    return handlers


@router.post("/invocations", responses=ENCODED_RESPONSES)
async def invocations(request: Request, body: dict[str, Any] = Body(...)):
    """SageMaker's single route: the body goes to the first handler whose request it is,
    tried in vLLM's order."""
    handlers = _invocation_handlers(get_state(request))
    for model, handler in handlers:
        try:
            parsed = model.model_validate(body)
        except ValidationError:
            continue
        return await handler(parsed, request)
    names = [model.__name__ for model, _ in handlers]
    raise bad_request(f"Cannot find suitable handler for request. Expected one of: {names}")
