"""pooler's own NER route: POST /ner -> entities with character offsets per input."""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from pooler.server.errors import ERROR_RESPONSES
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


@router.post("/ner", response_model=NERResponse, responses=ERROR_RESPONSES)
async def ner(body: NERRequest, request: Request):
    """Token classification grouped into entities, e.g. {entity_group: "PER", word: "Ada",
    start: 0, end: 3, score: 0.99}; `aggregation_strategy` as in transformers' pipeline."""
    state: ServerState = request.app.state.pooler
    state.check_model(body.model)
    state.require("ner", "token_classify", "named-entity recognition")
    items = state.inputs(body.input, "input")
    truncation = state.truncation(body, only_set=True)
    ignore = tuple(body.ignore_labels) if body.ignore_labels is not None else None

    def compute():
        kwargs = {"aggregation_strategy": body.aggregation_strategy, "use_tqdm": False}
        if ignore is not None:
            kwargs["ignore_labels"] = ignore
        results = state.call("ner", items, **kwargs, **truncation)
        data = [{"index": i, "object": "entities", "entities": [_entity(e) for e in ents]}
                for i, ents in enumerate(results)]
        return {"id": f"ner-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": state.model_name, "data": data}

    return await state.respond(request, len(items), "input", compute)
