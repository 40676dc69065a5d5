"""pooler's own NER route: POST /ner -> entities with character offsets per input."""
from __future__ import annotations

import time
import uuid

from typing import Any, Union

from fastapi import APIRouter, Body, Request

from pooler.gliner import (LabelsTooLongError, gliner_options_error, labels_required_error,
                           misplaced_options, normalize_labels, token_options_error)
from pooler.server.dialects import tei
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import NERRequest, NERResponse
from pooler.server.state import ServerState

router = APIRouter(tags=["pooler"])

_ENTITY_FIELDS = ("entity_group", "entity", "score", "word", "start", "end")


def _entity(e) -> dict:
    out = {}
    for name in _ENTITY_FIELDS:
        value = e.get(name) if isinstance(e, dict) else getattr(e, name, None)
        if value is None and name in ("entity_group", "entity"):
            continue
        out[name] = float(value) if name == "score" else \
            int(value) if name in ("start", "end") and value is not None else value
    return out


# huggingface_hub's token_classification body: {inputs: text, parameters: {...}}.
_PIPELINE_BODY = {"type": "object", "required": ["inputs"], "properties": {
    "inputs": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "parameters": {"type": "object", "properties": {
        "aggregation_strategy": {"enum": ["none", "simple", "first", "average", "max"]},
        "ignore_labels": {"type": "array", "items": {"type": "string"}}}}}}
# NERRequest goes to the spec's components (openapi_spec._hoist_defs moves $defs there).
_NER_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"anyOf": [{"$ref": "#/$defs/NERRequest"}, _PIPELINE_BODY],
               "$defs": {"NERRequest": NERRequest.model_json_schema()}}}}}}


# pooler's answer, or the pipeline's entities (a list per text for a batch of texts).
_PIPELINE_ANSWER = Union[list[dict[str, Any]], list[list[dict[str, Any]]]]


@router.post("/ner", response_model=Union[NERResponse, _PIPELINE_ANSWER],
             responses=ERROR_RESPONSES, openapi_extra=_NER_BODY)
async def ner_route(request: Request, body: dict[str, Any] = Body(...)):
    """pooler's {input, ...} -> {data: [{entities}]}; a body with `inputs` instead is
    huggingface_hub's token_classification (InferenceClient(base_url=".../ner")), answered
    as transformers' pipeline answers: [{entity_group, score, word, start, end}]."""
    if "inputs" in body and "input" not in body:
        return await tei.tei_errors(lambda: tei.entities(body, request))
    return await ner(NERRequest.model_validate(body), request)


async def ner(body: NERRequest, request: Request):
    """Entities with character offsets, e.g. {entity_group: "PER", word: "Ada", start: 0,
    end: 3, score: 0.99}. A token-classification model: its own labels, tokens grouped as
    `aggregation_strategy` says (as transformers' pipeline). A GLiNER model (zero-shot): the
    entity types in `labels`, spans above `threshold`, `flat_ner` / `multi_label` as gliner's
    predict_entities; entity_group is the label."""
    state: ServerState = request.app.state.pooler
    state.check_model(body.model)
    state.require("ner", "token_classify", "named-entity recognition")
    items = state.inputs(body.input, "input")
    truncation = state.truncation(body, only_set=True)
    ignore = tuple(body.ignore_labels) if body.ignore_labels is not None else None
    kwargs = {"aggregation_strategy": body.aggregation_strategy, "use_tqdm": False}
    if ignore is not None:
        kwargs["ignore_labels"] = ignore
    kwargs.update(_gliner_options(state, body, len(items)))

    def compute():
        try:
            results = state.call("ner", items, **kwargs, **truncation)
        except LabelsTooLongError as exc:
            raise bad_request(str(exc), "labels") from None
        data = [{"index": i, "object": "entities", "entities": [_entity(e) for e in ents]}
                for i, ents in enumerate(results)]
        return {"id": f"ner-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": state.model_name, "data": data}

    return await state.respond(request, len(items), "input", compute)


def _gliner_options(state: ServerState, body: NERRequest, num_items: int) -> dict:
    """The zero-shot options, checked before any work is admitted: a 400 naming the field."""
    options = {"labels": body.labels, "threshold": body.threshold, "flat_ner": body.flat_ner,
               "multi_label": body.multi_label}
    is_gliner = getattr(state.engine.model_config, "gliner", None) is not None
    if not is_gliner:
        given = misplaced_options((name, value, None) for name, value in options.items())
        if given:  # the first one named, as the 400's param
            raise bad_request(gliner_options_error(given[:1], "serve"), given[0])
        return {}
    if body.labels is None:
        raise bad_request(labels_required_error('"labels": ["person", "company"]'), "labels")
    try:
        normalize_labels(body.labels, num_items)
    except ValueError as exc:
        raise bad_request(str(exc), "labels") from None
    refused = misplaced_options((
        ("aggregation_strategy", body.aggregation_strategy, "simple"),
        ("ignore_labels", body.ignore_labels, None),
        ("truncation_direction", body.truncation_direction.lower(), "right"),
        ("truncate_prompt_tokens",
         None if body.truncate_prompt_tokens == -1 else body.truncate_prompt_tokens, None)))
    if refused:
        raise bad_request(token_options_error(refused[:1]), refused[0])
    return {name: value for name, value in options.items() if value is not None}
