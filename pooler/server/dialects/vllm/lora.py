"""vLLM's LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind
--api-key like every route). Adapters are chosen per request by the `model` field
(state.check_model) and listed in /v1/models."""
from __future__ import annotations

import asyncio
from typing import Optional

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, StrictStr

from pooler.server.errors import ERROR_RESPONSES, APIError, bad_request
from pooler.server.state import ServerState

router = APIRouter(tags=["vLLM"])


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr
    lora_path: StrictStr
    load_inplace: bool = False  # replace an adapter of the same name


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr
    lora_int_id: Optional[int] = None  # vLLM's; pooler names adapters only


def _state(request: Request) -> ServerState:
    state = request.app.state.pooler
    if not getattr(state.engine, "lora_enabled", False):
        raise bad_request("This server was started without LoRA adapters; start it with "
                          "--enable-lora (or --lora-modules) to load them at run time.",
                          code="lora_not_enabled")
    return state


async def _between_steps(state: ServerState, fn, *args):
    # Engine.add_lora / remove_lora wait for the engine loop: off the event loop.
    return await asyncio.get_running_loop().run_in_executor(state.executor, fn, *args)


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
             responses=ERROR_RESPONSES)
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request):
    state = _state(request)
    if body.lora_name in state.model_names:
        raise bad_request(f"lora_name {body.lora_name!r} is the base model's name; pick "
                          "another.", "lora_name")
    if body.lora_name in state.lora_names and not body.load_inplace:
        raise bad_request(f"The LoRA adapter {body.lora_name!r} has already been loaded; "
                          "unload it first or pass load_inplace=true.", "lora_name")
    try:
        await _between_steps(state, state.engine.add_lora, body.lora_name, body.lora_path,
                             body.load_inplace)
    except ValueError as exc:
        raise bad_request(str(exc), "lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
             responses=ERROR_RESPONSES)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request):
    state = _state(request)
    if body.lora_name not in state.lora_names:
        raise APIError(404, f"The LoRA adapter {body.lora_name!r} is not loaded; loaded "
                       f"adapters: {state.lora_names or 'none'}.", param="lora_name",
                       code="lora_not_found")
    await _between_steps(state, state.engine.remove_lora, body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
