"""OpenAI-compatible routes: GET /v1/models. (POST /v1/embeddings, with vLLM's options, is in
vllm/routes.py.)"""
from __future__ import annotations

from fastapi import APIRouter, Request

from pooler.server.dialects import quantized
from pooler.server.errors import ERROR_RESPONSES
from pooler.server.protocol import ModelList
from pooler.server.state import ServerState

router = APIRouter(tags=["OpenAI"])


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request):
    state = get_state(request)
    max_len = state.engine.model_config.max_model_len
    base = {"id": state.model_name, "object": "model", "created": int(state.started_at),
            "owned_by": "pooler", "root": state.model_root, "max_model_len": max_len}
    # Each LoRA adapter is a model of its own for clients (as vLLM lists them).
    adapters = [{**base, "id": name, "root": name, "parent": state.model_name}
                for name in state.lora_names]
    return {"object": "list", "data": [base, *adapters]}
