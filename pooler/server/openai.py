"""OpenAI-compatible routes: POST /v1/embeddings, GET /v1/models."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request

from pooler.server.errors import ERROR_RESPONSES
from pooler.server.protocol import EmbeddingRequest, EmbeddingResponse, ModelList
from pooler.server.state import ServerState, usage, vector

router = APIRouter(tags=["OpenAI"])


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


@router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERROR_RESPONSES)
async def create_embeddings(body: EmbeddingRequest, request: Request):
    state = get_state(request)
    state.check_model(body.model)
    state.require("embed", "embed", "embeddings")
    items = state.inputs(body.input, "input")
    state.check_dimensions(body.dimensions)
    truncation = state.truncation(body)

    def compute():
        outputs = state.engine.embed(items, dimensions=body.dimensions,
                                     normalize=body.normalize, prompt_name=body.prompt_name,
                                     use_tqdm=False, **truncation)
        data = [{"object": "embedding", "index": i,
                 "embedding": vector(o.embedding, body.encoding_format)}
                for i, o in enumerate(outputs)]
        return {"object": "list", "data": data, "model": state.model_name,
                "usage": usage(sum(o.num_tokens for o in outputs))}

    return await state.respond(request, len(items), "input", compute)


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request):
    state = get_state(request)
    return {"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": int(state.started_at),
        "owned_by": "pooler", "root": state.model_root,
        "max_model_len": state.engine.model_config.max_model_len}]}
