"""text-embeddings-inference (TEI) routes, as TEI's router serves them:
POST / (by model type), /embed, /embed_all, /embed_sparse, /predict, /similarity, /decode,
/embeddings (TEI's OpenAI alias); GET / and /ping (health). TEI's /rerank and /tokenize bodies
are dispatched here from the shared paths (vllm/rerank.py, vllm/routes.py); /info's TEI fields
come from `info_fields`.

TEI >= 1.9 defaults: `truncate` unset means auto-truncate (the server's `auto_truncate`, on),
`truncate: false` makes an over-long input a 422. Errors are TEI's ErrorResponse
{"error", "error_type"} with TEI's status codes: 400 Empty, 422 Validation/Tokenizer,
424 Backend (the model cannot do that), 429 Overloaded, 503 Unhealthy.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Awaitable, Callable

import numpy as np
from fastapi import APIRouter, Body, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from pooler.engine.engine_loop import RequestCancelled
from pooler.server.dialects import cohere, quantized
from pooler.server.dialects.long_documents import long_document_options
from pooler.server.errors import APIError, bad_request, validation_message
from pooler.server.protocol import (TEIDecodeRequest, TEIEmbedAllRequest, TEIEmbedRequest,
                                    TEIPredictRequest, TEIRerankRequest, TEISimilarityRequest,
                                    TEISparseRequest, TEISparseValue, TEITokenizeRequest)
from pooler.server.state import ServerState

# TEI >= 1.9 starts with --auto-truncate on; pooler has no switch to turn it off.
AUTO_TRUNCATE = True


# ---- errors in TEI's shape --------------------------------------------------------------------
class TEIError(Exception):
    STATUS = {"Empty": 400, "Validation": 422, "Tokenizer": 422, "Backend": 424,
              "Overloaded": 429, "Unhealthy": 503}

    def __init__(self, error_type: str, message: str,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.headers = headers  # Retry-After on refusals

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.message, "error_type": self.error_type},
                            status_code=self.STATUS[self.error_type], headers=self.headers)


def empty(field: str) -> TEIError:
    return TEIError("Empty", f"`{field}` cannot be empty")


def as_tei_error(exc: Exception) -> TEIError | None:
    """Translate what pooler raises into TEI's error classes; None: not a client error."""
    if isinstance(exc, TEIError):
        return exc
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, _ = validation_message(list(exc.errors()))
        return TEIError("Validation", f"Failed to deserialize the JSON body into the target "
                                      f"type: {message}")
    if isinstance(exc, APIError):
        if exc.code == "too_many_inputs":
            return TEIError("Validation", exc.message)
        if exc.code == "queue_full":
            return TEIError("Overloaded", f"Model is overloaded: {exc.message}", exc.headers)
        if exc.status == 503:  # shutting down: TEI's Unhealthy, with the retry hint
            return TEIError("Unhealthy", exc.message, exc.headers)
        if exc.code == "unsupported_task":
            return TEIError("Backend", exc.message)
        if exc.status in (400, 404, 422):
            return TEIError("Validation", exc.message)
        return None
    if isinstance(exc, RequestCancelled):
        return None  # the app's handler logs a 499
    if isinstance(exc, ValueError):
        return TEIError("Validation", str(exc))
    if isinstance(exc, RuntimeError):
        return TEIError("Backend", f"Inference failed: {exc}")
    return None


async def tei_errors(run: Callable[[], Awaitable[Response]]) -> Response:
    try:
        return await run()
    except Exception as exc:  # noqa: BLE001 - re-raised below unless it is a client error
        error = as_tei_error(exc)
        if error is None:
            raise
        return error.response()


class TEIRoute(APIRoute):
    """Every error a TEI route raises (body validation included) leaves in TEI's shape."""
    dialect = "tei"  # pooler/server/dialects/by_path.py

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def with_tei_errors(request: Request) -> Response:
            return await tei_errors(functools.partial(handler, request))

        return with_tei_errors


router = APIRouter(tags=["TEI"], route_class=TEIRoute)

_TEI_ERRORS = {code: {"description": text, "content": {"application/json": {"example": {
    "error": text, "error_type": kind}}}}
    for code, text, kind in ((400, "Batch is empty", "Empty"),
                             (422, "Tokenization or validation error", "Validation"),
                             (424, "The model cannot do this", "Backend"),
                             (429, "Model is overloaded", "Overloaded"))}


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


# ---- shared pieces ----------------------------------------------------------------------------
def truncation(body) -> dict[str, Any]:
    """Engine kwargs: `truncate` unset -> auto-truncate; direction only when it is Left (so
    Engine methods without that option still serve the default)."""
    out: dict[str, Any] = {"truncate": AUTO_TRUNCATE if body.truncate is None
                           else bool(body.truncate)}
    if body.truncation_direction.lower() == "left":
        out["truncation_direction"] = "left"
    return out


def inputs(state: ServerState, raw: Any, field: str = "inputs") -> list:
    if isinstance(raw, list) and not raw:
        raise empty(field)
    return state.inputs(raw, field)


def check_token_ids(state: ServerState, ids: list[int], field: str) -> None:
    vocab = state.engine.tokenizer.vocab_size
    bad = [t for t in ids if t < 0 or t >= vocab]
    if bad:  # shared with vLLM's /detokenize: an APIError, which TEI routes turn into a 422
        raise bad_request(f"'{field}' has token ids outside the vocabulary [0, {vocab}): "
                          f"{bad[:5]}.", field)


def check_prompt(state: ServerState, prompt_name: str | None) -> str | None:
    """The prompt text for `prompt_name`; unknown names are TEI's 422, whose message lists the
    model's prompts as TEI does ("Available prompts: [...]": TEI's clients parse it)."""
    if prompt_name is None:
        return None
    st = state.engine.model_config.st
    prompts = st.prompts if st is not None else {}
    if not prompts:
        raise TEIError("Validation", f"`prompt_name` is set to `{prompt_name}` but no prompts "
                                     "were found in the Sentence Transformers configuration")
    if prompt_name not in prompts:
        listed = ", ".join(f'"{name}"' for name in prompts)
        raise TEIError("Validation", f"`prompt_name` is set to `{prompt_name}` but it was not "
                                     "found in the Sentence Transformers prompts. Available "
                                     f"prompts: [{listed}]")
    return prompts[prompt_name]


def require(state: ServerState, task: str, kind: str) -> None:
    """424 as TEI answers a model of the wrong type ("Model is not an embedding model")."""
    if task not in state.engine.supported_tasks:
        raise TEIError("Backend", f"Model is not {kind} model: this server's model "
                                  f"({state.engine.model_config.architecture}) does "
                                  f"{sorted(state.engine.supported_tasks)}.")


def model_kind(state: ServerState) -> str:
    """TEI's model type: "embedding", "classifier" or "reranker" (a one-label classifier)."""
    engine = state.engine
    if engine.default_task == "classify":
        return "reranker" if len(engine.model_config.id2label or {0: ""}) == 1 else "classifier"
    if engine.default_task == "token_classify":
        return "classifier"  # TEI has no token classifiers; this is the closest type
    return "embedding"


def info_fields(state: ServerState, version: str) -> dict[str, Any]:
    """Every field of TEI's Info schema, for /info."""
    engine, settings = state.engine, state.settings
    kind = model_kind(state)
    if kind == "embedding":
        st = engine.model_config.st
        pooling = "splade" if engine.model_config.head == "mlm" else \
            (st.pooling.mode if st and st.pooling else "cls")
        model_type = {"embedding": {"pooling": pooling}}
    else:
        id2label = {str(i): str(label) for i, label in
                    sorted((engine.model_config.id2label or {0: "LABEL_0"}).items())}
        model_type = {kind: {"id2label": id2label,
                             "label2id": {v: int(k) for k, v in id2label.items()}}}
    sc = engine.config.scheduler_config
    return {"model_id": state.model_name, "model_sha": None,
            "model_dtype": engine.model_config.dtype, "served_model_name": state.model_name,
            "model_type": model_type, "max_concurrent_requests": settings.max_queue,
            "max_input_length": engine.model_config.max_model_len,
            "max_batch_tokens": sc.max_num_batched_tokens,
            "max_batch_requests": sc.max_num_seqs,
            "max_client_batch_size": settings.max_input_items,
            "auto_truncate": AUTO_TRUNCATE, "tokenization_workers": settings.max_workers,
            "version": version, "sha": None, "docker_label": None}


# ---- routes -----------------------------------------------------------------------------------
async def _embed(body: TEIEmbedRequest, request: Request):
    state = get_state(request)
    require(state, "embed", "an embedding")
    items = inputs(state, body.inputs)
    if body.dimensions is not None and body.dimensions <= 0:
        raise TEIError("Validation", "`dimensions` should be positive")
    state.check_dimensions(body.dimensions)
    check_prompt(state, body.prompt_name)
    kwargs = truncation(body)
    if body.ranges is not None:
        quantized.server_ranges(body.ranges, body.dimensions or state.engine.embedding_size)

    def compute():
        outputs = state.engine.embed(
            items, normalize=body.normalize, dimensions=body.dimensions,
            prompt_name=body.prompt_name, use_tqdm=False, **kwargs)
        # pooler's addition (issue 16): int8/uint8/binary/ubinary codes instead of floats
        matrix = quantized.quantize(np.stack([o.embedding for o in outputs]), body.precision,
                                    body.ranges)
        return [quantized.encode(row, "float") for row in matrix]

    return await state.respond(request, len(items), "inputs", compute)


_EMBED_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": TEIEmbedRequest.model_json_schema()}}}}


@router.post("/embed", response_model=list[list[float]], responses=_TEI_ERRORS,
             openapi_extra=_EMBED_BODY)
async def embed(request: Request, body: dict[str, Any] = Body(...)):
    """TEI's {inputs, normalize, truncate, dimensions, prompt_name} -> [[float]].
    A Cohere v1 body ({texts, ...}) is answered as Cohere's /v1/embed."""
    if "texts" in body and "inputs" not in body:
        return await cohere.embed_v1_from_dict(body, request)
    return await _embed(TEIEmbedRequest.model_validate(body), request)


@router.post("/embed_all", response_model=list[list[list[float]]], responses=_TEI_ERRORS)
async def embed_all(body: TEIEmbedAllRequest, request: Request):
    """One vector per token (no pooling, no normalization), as TEI."""
    state = get_state(request)
    require(state, "token_embed", "an embedding")
    items = inputs(state, body.inputs)
    check_prompt(state, body.prompt_name)
    kwargs = truncation(body)

    def compute():
        outputs = state.engine.token_embed(items, normalize=False, prompt_name=body.prompt_name,
                                           use_tqdm=False, **kwargs)
        return [o.embeddings.tolist() for o in outputs]

    return await state.respond(request, len(items), "inputs", compute)


@router.post("/embed_sparse", response_model=list[list[TEISparseValue]],
             responses=_TEI_ERRORS)
async def embed_sparse(body: TEISparseRequest, request: Request):
    state = get_state(request)
    if state.engine.model_config.head != "mlm" or "embed" not in state.engine.supported_tasks:
        raise TEIError("Backend", "Model is not an embedding model with SPLADE pooling: it "
                                  "needs a masked-LM model (*ForMaskedLM, e.g. SPLADE) and "
                                  f"this one is {state.engine.model_config.architecture}.")
    items = inputs(state, body.inputs)
    check_prompt(state, body.prompt_name)
    kwargs = truncation(body)

    def compute():
        outputs = state.call("embed_sparse", items, prompt_name=body.prompt_name,
                             use_tqdm=False, **kwargs)
        return [[{"index": int(i), "value": float(v)} for i, v in zip(o.indices, o.values)]
                for o in outputs]

    return await state.respond(request, len(items), "inputs", compute)


async def _rerank(body: TEIRerankRequest, request: Request):
    """TEI's /rerank: {query, texts} -> [{index, score, text?}] best first."""
    state = get_state(request)
    if not body.texts:
        raise empty("texts")
    if model_kind(state) != "reranker" or "rerank" not in _methods(state):
        raise TEIError("Backend", "model is not a re-ranker model: /rerank needs a "
                                  "cross-encoder (a sequence classifier with one label).")
    kwargs = truncation(body)
    long_documents = long_document_options(body)  # pooler's addition

    def compute():
        results = state.call("rerank", body.query, list(body.texts),
                             use_activation=False if body.raw_scores else None,
                             use_tqdm=False, **kwargs, **long_documents)
        # TEI sorts ascending and reverses: of two equal scores the later text comes first.
        ranked = sorted(results, key=lambda r: float(r.score))[::-1]
        out = []
        for r in ranked:
            item: dict[str, Any] = {"index": int(r.index)}
            if body.return_text:
                item["text"] = body.texts[r.index]
            item["score"] = float(r.score)
            if r.num_windows is not None:  # pooler's addition, long_input "chunk" only
                item["num_windows"] = int(r.num_windows)
            out.append(item)
        return out

    return await state.respond(request, len(body.texts), "texts", compute)


def _methods(state: ServerState) -> set[str]:
    return {m for m in ("rerank", "classify", "embed_sparse", "ner")
            if callable(getattr(state.engine, m, None))}


async def rerank_tei(body: dict | TEIRerankRequest, request: Request) -> Response:
    """TEI's /rerank body on the shared /rerank path (vllm/rerank.py), with TEI's errors."""
    return await tei_errors(lambda: _rerank(TEIRerankRequest.model_validate(body), request))


def predict_inputs(raw) -> tuple[list[str], list[str | None], bool]:
    """TEI's PredictInput: "text"; ["text"]; ["text", "pair"]; or a batch
    [["text"], ["text", "pair"], ...] (singles and pairs mixed). Returns (texts, the pair of
    each or None, single)."""
    if isinstance(raw, str):
        return [raw], [None], True
    if not raw:
        raise empty("inputs")
    if isinstance(raw[0], str):
        if len(raw) > 2 or not all(isinstance(x, str) for x in raw):
            raise TEIError("Validation", "`inputs` must be a string, a pair of strings "
                                         "[string, string] or a batch of mixed strings and "
                                         "pairs [[string], [string, string], ...]; got a flat "
                                         f"list of {len(raw)} items (for a batch of single "
                                         "texts send [[text], [text], ...]).")
        return [raw[0]], [None if len(raw) == 1 else raw[1]], True
    texts, pairs = [], []
    for i, item in enumerate(raw):
        if not isinstance(item, list) or len(item) not in (1, 2):
            raise TEIError("Validation", f"inputs[{i}] must be [text] or [text, text_pair], "
                                         f"got {item!r:.80}.")
        texts.append(item[0])
        pairs.append(item[1] if len(item) == 2 else None)
    return texts, pairs, False


async def _predict(body: TEIPredictRequest, request: Request):
    """Sequence classification: [{score, label}] for one input (best first), a list of those
    for a batch. raw_scores=true gives logits."""
    state = get_state(request)
    if state.engine.default_task != "classify" or "classify" not in _methods(state):
        raise TEIError("Backend", "Model is not a classifier model: /predict needs a sequence "
                                  "classification model (or a cross-encoder).")
    texts, pairs, single = predict_inputs(body.inputs)
    kwargs = truncation(body)

    def compute():
        # Engine.classify takes all singles or all pairs: one call per kind, then the results
        # go back in input order.
        outputs: list = [None] * len(texts)
        for is_pair in (False, True):
            where = [i for i, p in enumerate(pairs) if (p is not None) == is_pair]
            if not where:
                continue
            results = state.call("classify", [texts[i] for i in where],
                                 text_pair=[pairs[i] for i in where] if is_pair else None,
                                 use_activation=False if body.raw_scores else None,
                                 use_tqdm=False, **kwargs)
            for i, result in zip(where, results):
                outputs[i] = result
        ranked = [sorted(({"score": float(l["score"]), "label": str(l["label"])}
                          for l in o.labels), key=lambda x: x["score"])[::-1] for o in outputs]
        return ranked[0] if single else ranked

    return await state.respond(request, len(texts), "inputs", compute)


def _predict_schema() -> dict:
    """TEIPredictRequest's schema with `inputs` as predict_inputs takes it: a text, a
    [text] or [text, pair] list, or a batch of those lists (not a flat list of 3+ texts)."""
    schema = TEIPredictRequest.model_json_schema()
    one = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}
    schema["properties"]["inputs"] = {"anyOf": [
        {"type": "string"}, one, {"type": "array", "items": one, "minItems": 1}]}
    return schema


_PREDICT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": _predict_schema()}}}}


@router.post("/predict", response_model=list, responses=_TEI_ERRORS,
             openapi_extra=_PREDICT_BODY)
async def predict(request: Request, body: dict[str, Any] = Body(...)):
    """TEI's {inputs, raw_scores, truncate} -> [{score, label}] best first (a list of those
    for a batch). One text with `parameters` is huggingface_hub's text_classification (its
    InferenceClient(base_url=".../predict")), answered as on POST /: [[{label, score}]]."""
    if isinstance(body.get("inputs"), str) and isinstance(body.get("parameters"), dict):
        return await _pipeline_classify(body, request)
    return await _predict(TEIPredictRequest.model_validate(body), request)


async def _similarity(body: TEISimilarityRequest, request: Request):
    """sentence-transformers' similarity: the cosine of source_sentence with each sentence."""
    state = get_state(request)
    require(state, "embed", "an embedding")
    if not body.inputs.sentences:
        raise empty("inputs.sentences")
    params = body.parameters
    check_prompt(state, params.prompt_name)
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    kwargs = truncation(params)

    def compute():
        outputs = state.engine.embed(texts, normalize=False, prompt_name=params.prompt_name,
                                     use_tqdm=False, **kwargs)
        matrix = np.stack([o.embedding for o in outputs]).astype(np.float64)  # [1 + n, dim]
        unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True).clip(min=1e-12)
        return [float(x) for x in unit[1:] @ unit[0]]

    return await state.respond(request, len(texts), "inputs.sentences", compute)


@router.post("/similarity", response_model=list[float], responses=_TEI_ERRORS)
async def similarity(body: TEISimilarityRequest, request: Request):
    return await _similarity(body, request)


async def _tokenize(body: TEITokenizeRequest, request: Request):
    state = get_state(request)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    if not texts:
        raise empty("inputs")
    prompt = check_prompt(state, body.prompt_name)  # TEI adds a prompt only when asked to
    tokenizer = state.engine.tokenizer

    def compute():
        full = [(prompt or "") + t for t in texts]
        encoded = tokenizer.encode_batch(full, add_special_tokens=body.add_special_tokens)
        out = []
        for text, enc in zip(full, encoded):
            tokens = []
            for tid, special, (start, stop) in zip(enc.input_ids, enc.special_tokens_mask,
                                                   enc.offsets):
                if special:
                    tokens.append({"id": tid, "text": tokenizer.id_to_token(tid),
                                   "special": True, "start": None, "stop": None})
                else:
                    tokens.append({"id": tid, "text": text[start:stop], "special": False,
                                   "start": start, "stop": stop})
            out.append(tokens)
        return out

    return await state.respond(request, len(texts), "inputs", compute, model_step=False)


async def tokenize_tei(body: dict | TEITokenizeRequest, request: Request) -> Response:
    """TEI's /tokenize body on the shared /tokenize path (vllm/routes.py), with TEI's errors."""
    return await tei_errors(lambda: _tokenize(TEITokenizeRequest.model_validate(body), request))


@router.post("/decode", response_model=list[str], responses=_TEI_ERRORS)
async def decode(body: TEIDecodeRequest, request: Request):
    state = get_state(request)
    if not body.ids:
        raise empty("ids")
    batches = body.ids if isinstance(body.ids[0], list) else [body.ids]
    for i, ids in enumerate(batches):
        if not ids:
            raise empty(f"ids[{i}]")
        check_token_ids(state, ids, "ids")

    def compute():
        return [state.engine.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)
                for ids in batches]

    return await state.respond(request, len(batches), "ids", compute, model_step=False)


# ---- POST / (the Inference API route) and health ---------------------------------------------
def _root_route(state: ServerState, body: dict) -> str:
    """Which TEI route answers POST /: the body's shape first (a sentence-similarity
    {inputs: {source_sentence, sentences}} or a rerank {query, texts}), else the model type,
    as TEI picks its default route (huggingface_hub's InferenceClient(url) posts here)."""
    raw = body.get("inputs")
    if isinstance(raw, dict) and "source_sentence" in raw:
        return "similarity"
    if "query" in body and "texts" in body:
        return "rerank"
    task = state.engine.default_task
    if task == "token_classify":
        return "ner"
    if task == "classify":
        return "predict"
    if state.engine.model_config.head == "mlm":
        return "embed_sparse"
    return "embed"


@router.post("/", responses=_TEI_ERRORS, openapi_extra={"requestBody": {
    "required": True, "content": {"application/json": {"schema": {"type": "object"}}}}})
async def root(request: Request, body: dict[str, Any] = Body(...)):
    """TEI's default route: /embed for an embedder (/embed_sparse for SPLADE), /predict for a
    classifier, /rerank for a reranker; a similarity body is answered as /similarity and, for a
    token classifier, a text as transformers' token-classification pipeline (entities)."""
    state = get_state(request)
    route = _root_route(state, body)
    if route == "similarity":
        return await _similarity(TEISimilarityRequest.model_validate(body), request)
    if route == "rerank":
        return await _rerank(TEIRerankRequest.model_validate(body), request)
    if route == "predict":
        if "parameters" in body:  # the HF Inference API's text-classification body
            return await _pipeline_classify(body, request)
        return await _predict(TEIPredictRequest.model_validate(body), request)
    if route == "ner":
        return await entities(body, request)
    if route == "embed_sparse":
        return await embed_sparse(TEISparseRequest.model_validate(body), request)
    return await _embed(TEIEmbedRequest.model_validate(body), request)


def _parameters(body: dict) -> dict:
    """The HF Inference API's `parameters` object (absent or null: none)."""
    params = body.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise TEIError("Validation", f"`parameters` must be an object, got {params!r:.80}.")
    return params


async def _pipeline_classify(body: dict, request: Request):
    """huggingface_hub's text_classification: {inputs: text, parameters: {top_k,
    function_to_apply}} -> [[{label, score}]] best first, as the transformers pipeline answers
    (TEI's /predict shape would lose all but the top label in that client)."""
    raw, params = body.get("inputs"), _parameters(body)
    if not isinstance(raw, str):
        raise TEIError("Validation", "`inputs` must be one text for text classification.")
    top_k = params.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise TEIError("Validation", f"`parameters.top_k` must be a positive integer, got "
                                     f"{top_k!r}.")
    activation = params.get("function_to_apply")
    if activation not in (None, "none", "sigmoid", "softmax"):
        raise TEIError("Validation", "`parameters.function_to_apply` must be none, sigmoid or "
                                     f"softmax, got {activation!r}.")
    # function_to_apply is applied here to the logits; unset keeps the model's own activation
    response = await _predict(TEIPredictRequest(inputs=raw, raw_scores=activation is not None),
                              request)
    ranked = json.loads(response.body)
    if activation in ("sigmoid", "softmax"):
        logits = np.array([p["score"] for p in ranked], dtype=np.float64)  # [num_labels]
        if activation == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:
            scores = np.exp(logits - logits.max())
            scores /= scores.sum()
        ranked = [{"score": float(x), "label": p["label"]} for x, p in zip(scores, ranked)]
    return Response(json.dumps([ranked[:top_k]]), media_type="application/json")


async def entities(body: dict, request: Request):
    """huggingface_hub's token_classification: {inputs: text} -> [{entity_group, score, word,
    start, end}] (a list of those per text for a batch)."""
    state = get_state(request)
    raw = body.get("inputs")
    single = isinstance(raw, str)
    items = inputs(state, raw)
    params = _parameters(body)
    kwargs: dict[str, Any] = {"aggregation_strategy": params.get("aggregation_strategy")
                              or "simple"}
    ignore = params.get("ignore_labels")
    if ignore is not None:
        if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
            raise TEIError("Validation", "`parameters.ignore_labels` must be a list of "
                                         f"labels, got {ignore!r:.80}.")
        kwargs["ignore_labels"] = tuple(ignore)

    def compute():
        results = state.call("ner", items, use_tqdm=False, **kwargs)
        as_dicts = [[{k: (float(v) if k == "score" else v) for k, v in e.to_dict().items()}
                     for e in ents] for ents in results]
        return as_dicts[0] if single else as_dicts

    return await state.respond(request, len(items), "inputs", compute)


def _health(request: Request) -> Response:
    if not get_state(request).ready:
        return JSONResponse({"error": "unhealthy", "error_type": "Unhealthy"}, status_code=503)
    return JSONResponse({"status": "ok"})


# Declared in /openapi.json (TEI answers it and leaves it out of its spec, so a contract
# tester finds an undeclared 200 there).
_ROOT_HEALTH = {
    200: {"description": "the model is loaded", "content": {"application/json": {
        "example": {"status": "ok"}}}},
    503: {"description": "the model is not loaded yet", "content": {"application/json": {
        "example": {"error": "unhealthy", "error_type": "Unhealthy"}}}}}


@router.get("/", tags=["TEI"], responses=_ROOT_HEALTH)
async def root_health(request: Request):
    """The Inference API's health check, as TEI answers it: 200 `{"status": "ok"}` once the
    model is loaded, 503 before. Needs no API key."""
    return _health(request)


@router.get("/ping", tags=["TEI"])
async def ping(request: Request):
    """SageMaker's health route: 200 once the model is loaded, 503 before."""
    return _health(request)

