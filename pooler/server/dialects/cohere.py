"""Cohere's embed API: POST /v2/embed (cohere.ClientV2.embed) and /v1/embed (cohere.Client.embed;
also a Cohere body, {texts, ...}, on TEI's /embed path).

`embedding_types` float, int8, uint8, binary, ubinary and base64 (little-endian float32 bytes)
come back side by side under `embeddings`; the quantized kinds are pooler's (quantized.py:
fixed ranges, so a vector's codes do not depend on its batch), not Cohere's own calibration.
`model` may be any name (the server serves one model); a task adapter's name picks it, and
on a model that carries task adapters (jina-embeddings-v3) `input_type` picks the one made
for it (search_query -> retrieval.query, search_document -> retrieval.passage,
classification -> classification, clustering -> separation). `texts`, `images` (data URIs) or
`inputs` (text parts, or one image_url part each), one of them, as Cohere takes one kind of
input per request; images need a model that embeds them (pooler/server/media.py). `truncate`:
END (default) / START cut an over-long text on that side, NONE makes it a 400. Errors are
Cohere's {"message": ...}.
"""
from __future__ import annotations

import base64
import functools
import uuid
from typing import Any, Literal, Optional, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from pooler.engine.engine_loop import RequestCancelled
from pooler.server.dialects import quantized
from pooler.server.errors import ERROR_RESPONSES, APIError, bad_request, validation_message
from pooler.server.media import ImageRef, content_item, takes_images, text_only_refusal
from pooler.server.protocol import ImageURLPart, NullMeansUnset, part_dicts
from pooler.server.state import ServerState

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
# Cohere's input types, and the prompt names sentence-transformers models use for them.
_PROMPT_NAMES = {"search_query": ("query", "search_query"),
                 "search_document": ("document", "passage", "search_document"),
                 "classification": ("classification",), "clustering": ("clustering",)}
# Cohere's input types -> the task adapters of jina-embeddings-v3 made for them.
_TASK_ADAPTERS = {"search_query": "retrieval.query", "search_document": "retrieval.passage",
                  "classification": "classification", "clustering": "separation"}


class _Request(NullMeansUnset):
    model_config = ConfigDict(extra="ignore")


class CohereTextContent(_Request):
    type: Literal["text"] = "text"
    text: StrictStr


class CohereInput(_Request):
    content: list[Union[CohereTextContent, ImageURLPart, dict[str, Any]]]


class CohereEmbedRequest(_Request):
    texts: Optional[list[StrictStr]] = None
    images: Optional[list[StrictStr]] = Field(None, description=(
        "Images as data URIs ('data:image/png;base64,...'); an image-text model (CLIP, "
        "SigLIP) embeds each one. http(s):// and file:// URLs as the server's media flags "
        "allow."))
    inputs: Optional[list[CohereInput]] = Field(None, description=(
        "Each input's content: text parts ({type: text, text}) joined by spaces, or one "
        "image part ({type: image_url, image_url: {url}})."))
    model: Optional[StrictStr] = None
    input_type: Optional[StrictStr] = None
    embedding_types: Optional[list[EmbeddingType]] = None
    truncate: Literal["NONE", "START", "END"] = Field("END", description=(
        "END / START cut an over-long text on that side; NONE refuses it (a 400): a text of "
        "more tokens than max_tokens, or than the model's maximum without it."))
    output_dimension: Optional[int] = None
    max_tokens: Optional[int] = Field(None, description=(
        "Cut each text to this many tokens (special tokens included), on the side `truncate` "
        "names; with truncate NONE a longer text is a 400."))


# ---- errors in Cohere's shape -----------------------------------------------------------------
def _cohere_error(exc: Exception) -> Response | None:
    if isinstance(exc, (RequestValidationError, ValidationError)):
        message, _ = validation_message(list(exc.errors()))
        return JSONResponse({"message": message}, status_code=400)
    if isinstance(exc, APIError):
        return JSONResponse({"message": exc.message}, status_code=exc.status,
                            headers=exc.headers)
    if isinstance(exc, ValueError) and not isinstance(exc, RequestCancelled):
        return JSONResponse({"message": str(exc)}, status_code=400)
    return None


async def cohere_errors(run) -> Response:
    try:
        return await run()
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a client error
        response = _cohere_error(exc)
        if response is None:
            raise
        return response


class CohereRoute(APIRoute):
    dialect = "cohere"  # pooler/server/dialects/by_path.py

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def with_cohere_errors(request: Request) -> Response:
            return await cohere_errors(functools.partial(handler, request))

        return with_cohere_errors


router = APIRouter(tags=["Cohere"], route_class=CohereRoute)


# ---- the embed call ---------------------------------------------------------------------------
def _items(state: ServerState, body: CohereEmbedRequest) -> tuple[list, list[str] | None]:
    """The Engine items of a request (texts, and media.ImageRef for images, fetched later)
    and the `texts` its answer echoes (None: the request holds images)."""
    given = [name for name in ("texts", "images", "inputs") if getattr(body, name) is not None]
    # Cohere takes one kind of input per request (texts, images or inputs): two would leave
    # one of them silently unembedded.
    if len(given) > 1:
        raise bad_request(f"Pass one of 'texts', 'images' or 'inputs', not {' and '.join(given)}.",
                          given[-1])
    if not given:
        raise bad_request("Pass 'texts' (a list of strings), 'images' (data URIs) or 'inputs'.",
                          "texts")
    name = given[0]
    if not getattr(body, name):
        raise bad_request(f"'{name}' is empty: pass at least one item, or leave it out.", name)
    if body.input_type == "image" and name == "texts":
        raise bad_request("input_type 'image' embeds images: send them in 'images' (data URIs) "
                          "or 'inputs', or pick a text input_type.", "input_type")
    if name == "texts":
        return list(body.texts), list(body.texts)
    if name == "images":
        refs = [ImageRef(url, "images", i) for i, url in enumerate(body.images)]
        if not takes_images(state.engine):
            raise text_only_refusal(state.engine, refs[0])
        return refs, None
    items = []
    for i, item in enumerate(body.inputs):
        items.append(content_item(state.engine, part_dicts(item.content),
                                  f"inputs[{i}].content", separator=" "))
    texts = items if all(isinstance(x, str) for x in items) else None
    return items, texts


def _prompt_name(state: ServerState, input_type: str | None) -> str | None:
    """The model's own prompt for Cohere's input_type, when it declares one."""
    st = state.engine.model_config.st
    prompts = st.prompts if st else {}
    for name in _PROMPT_NAMES.get(input_type or "", ()):
        if name in prompts:
            return name
    return None


def _by_type(matrix: np.ndarray, types: list[str]) -> dict[str, Any]:
    """matrix [n, dim] float32 -> {embedding type: n vectors}."""
    out: dict[str, Any] = {}
    for kind in types:
        if kind == "float":
            out["float"] = matrix.tolist()
        elif kind == "base64":
            out["base64"] = [base64.b64encode(np.ascontiguousarray(row, "<f4").tobytes())
                             .decode() for row in matrix]
        else:
            out[kind] = quantized.quantize(matrix, kind).astype(np.int64).tolist()
    return out


async def _embed(body: CohereEmbedRequest, request: Request, version: str):
    state: ServerState = request.app.state.pooler
    state.require("embed", "embed", "embeddings")
    items, texts = _items(state, body)
    state.check_dimensions(body.output_dimension)
    types = list(dict.fromkeys(body.embedding_types or ["float"]))
    truncation = {"truncate": body.truncate != "NONE",
                  "truncation_direction": "left" if body.truncate == "START" else "right"}
    if body.max_tokens is not None:
        if body.max_tokens < state.min_truncation():
            raise bad_request(f"max_tokens must be at least {state.min_truncation()} (a text "
                              "keeps its special tokens plus one), got "
                              f"{body.max_tokens}.", "max_tokens")
        truncation["truncate_prompt_tokens"] = body.max_tokens
    prompt_name = _prompt_name(state, body.input_type) if texts is not None else None
    task = _TASK_ADAPTERS.get(body.input_type or "")
    adapter = {"task": task} if task in getattr(state.engine, "task_adapters", ()) else {}
    state.pick_lora(body.model)  # any name is accepted; an adapter's name picks it
    items, resolved = await state.resolve_images(items)  # off the event loop; 400 if bad

    def compute():
        outputs = state.engine.embed(items, dimensions=body.output_dimension,
                                     prompt_name=prompt_name, use_tqdm=False, **truncation,
                                     **adapter)
        matrix = np.stack([o.embedding for o in outputs])  # [n, dim] float32
        tokens = sum(o.num_tokens for o in outputs)
        meta = {"api_version": {"version": version},
                "billed_units": {"input_tokens": tokens}}
        common: dict[str, Any] = {"id": str(uuid.uuid4()), "meta": meta}
        if texts is not None:
            common["texts"] = texts
        if body.images is not None:  # Cohere describes each image it embedded
            common["images"] = [{"width": r.width, "height": r.height, "format": r.format,
                                 "bit_depth": r.bit_depth} for r in resolved.values()]
        if version == "1" and body.embedding_types is None:
            return {"response_type": "embeddings_floats", "embeddings": matrix.tolist(),
                    **common}
        return {"response_type": "embeddings_by_type", "embeddings": _by_type(matrix, types),
                **common}

    return await state.respond(request, len(items), "texts" if texts is not None else
                               "images" if body.images is not None else "inputs", compute)


@router.post("/v2/embed", responses=ERROR_RESPONSES)
async def embed_v2(body: CohereEmbedRequest, request: Request):
    """Cohere v2: {texts | inputs, model, input_type, embedding_types, truncate,
    output_dimension} -> {id, embeddings: {float, int8, ...}, texts, meta}."""
    return await _embed(body, request, "2")


@router.post("/v1/embed", responses=ERROR_RESPONSES)
async def embed_v1(body: CohereEmbedRequest, request: Request):
    """Cohere v1: as v2; without embedding_types the answer is the `embeddings_floats` kind."""
    return await _embed(body, request, "1")


async def embed_v1_from_dict(body: dict, request: Request) -> Response:
    """A Cohere body on TEI's /embed path (tei.py dispatches it here by its `texts` field)."""
    return await cohere_errors(
        lambda: _embed(CohereEmbedRequest.model_validate(body), request, "1"))
