"""What the vLLM-compatible handlers (routes.py, rerank.py) share: task checks worded as vLLM
words them, truncation options, chat `messages` -> token ids, ids and usage blocks."""
from __future__ import annotations

import functools
import time
import uuid
from typing import Any

from fastapi import Request

from pooler.pooling.activation import labels_of
from pooler.server.dialects.vllm.chat import ChatTemplateError, model_chat_template, render_chat
from pooler.server.errors import APIError, bad_request
from pooler.server.media import ImageRef, content_item, takes_images
from pooler.server.protocol import part_dicts
from pooler.server.state import ServerState


# vLLM's exact sentence (its tests compare the whole message); `param` names the field.
TRUNCATION_TOO_BIG = ("truncate_prompt_tokens value is greater than max_model_len. Please "
                      "request a smaller truncation size.")


def get_state(request: Request) -> ServerState:
    return request.app.state.pooler


def response_id(prefix: str, body) -> str:
    """vLLM's ids: prefix-<the client's request_id, or a fresh uuid>."""
    return f"{prefix}-{getattr(body, 'request_id', None) or uuid.uuid4().hex}"


def vllm_usage(num_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": int(num_tokens), "total_tokens": int(num_tokens),
            "completion_tokens": 0}


def envelope(prefix: str, state: ServerState, body, data: list, num_tokens: int) -> dict:
    return {"id": response_id(prefix, body), "object": "list", "created": int(time.time()),
            "model": state.model_name, "data": data, "usage": vllm_usage(num_tokens)}


def require_task(state: ServerState, task: str, what: str) -> None:
    """vLLM's wording ("Unsupported task: 'classify' ...") and pooler's plain words."""
    tasks = sorted(state.engine.supported_tasks)
    if task not in tasks:
        raise APIError(400, f"Unsupported task: {task!r}. Supported tasks: {tasks}. This "
                       f"model/engine does not support {what}.", param="task",
                       code="unsupported_task")


def scoring_unavailable_reason(state: ServerState) -> str | None:
    """vLLM serves /score and /rerank for embedding models (cosine), ColBERT (MaxSim) and
    classifiers with a single label (cross-encoders); elsewhere the routes do not exist."""
    engine = state.engine
    if engine.model_config.colbert is not None:
        return None
    task = engine.default_task
    if task in ("embed", "token_embed"):
        return None
    if task == "classify":
        num_labels = len(labels_of(engine.model_config.hf_config))
        if num_labels == 1:
            return None
        return (f"scoring needs a classifier with one label (a cross-encoder); this one has "
                f"{num_labels}")
    return f"this model's task is {task!r}"


def check_priority(body) -> None:
    if getattr(body, "priority", 0):
        raise bad_request("priority scheduling is not enabled on this server; leave priority "
                          "at 0.", "priority")


def truncation_options(state: ServerState, body) -> dict[str, Any]:
    """Engine truncation kwargs; vLLM's truncation_side is pooler's truncation_direction."""
    limit = body.truncate_prompt_tokens
    max_len = state.engine.model_config.max_model_len
    if limit is not None and limit > max_len:
        raise bad_request(TRUNCATION_TOO_BIG, "truncate_prompt_tokens")
    out = state.truncation(body)
    if getattr(body, "truncation_side", None):
        out["truncation_direction"] = body.truncation_side
    return out


@functools.lru_cache(maxsize=8)
def _model_template(state: ServerState) -> str | None:
    mc = state.engine.model_config
    return model_chat_template(mc.tokenizer_config, mc.path)


def chat_token_ids(state: ServerState, body, add_special_tokens: bool,
                   chat=None) -> list[int]:
    """Render a chat (default: body.messages) with the chat template (the request's, else
    the model's) and tokenize the prompt."""
    messages = [m.model_dump(exclude_none=False) for m in (chat or body.messages)]
    try:
        prompt = render_chat(messages, body.chat_template or _model_template(state),
                             state.engine.model_config.tokenizer_config,
                             add_generation_prompt=body.add_generation_prompt,
                             continue_final_message=body.continue_final_message,
                             template_kwargs=body.chat_template_kwargs,
                             tools=body.tools)
    except ChatTemplateError as exc:
        raise bad_request(str(exc), "messages") from None
    ids = state.engine.tokenizer.encode_batch([prompt],
                                              add_special_tokens=add_special_tokens)[0].input_ids
    if not ids:
        raise bad_request("The chat renders to an empty prompt.", "messages")
    return ids


def prompt_inputs(state: ServerState, body) -> tuple[list, bool]:
    """Engine inputs of an input-or-messages body, and add_special_tokens for text inputs.
    A chat becomes token ids here (special tokens only if asked: vLLM's default for chat)."""
    if body.messages is not None:
        batch = isinstance(body.messages[0], list)
        items = []
        for c, chat in enumerate(body.conversations()):
            item = chat_media_item(state, body, chat, f"messages[{c}]" if batch else "messages")
            items.append(item if item is not None else
                         chat_token_ids(state, body, bool(body.add_special_tokens), chat))
        return items, True
    add_special = body.add_special_tokens is not False
    items = state.inputs(body.input, "input")
    empty = next((i for i, item in enumerate(items) if isinstance(item, str) and not item), None)
    if empty is not None:  # vLLM (and OpenAI) refuse an empty prompt
        where = "'input'" if isinstance(body.input, str) else f"input[{empty}]"
        raise bad_request(f"{where} is an empty string: pass text to embed (an empty prompt "
                          "has no tokens to pool).", "input")
    return items, add_special


def chat_media_item(state: ServerState, body, chat, prefix: str):
    """A chat as one Engine item on a model that takes images (vLLM serves CLIP and SigLIP
    this way): its text (the contents in order, as vLLM's template_basic.jinja renders them)
    or its one image (a media.ImageRef, fetched later), or both in vLLM's offline form for
    the Engine to accept or refuse. None on a text-only model whose chat is all text (it goes
    through the chat template); an image there is a 400 naming its part."""
    engine = state.engine
    pieces = []
    for i, message in enumerate(chat):
        if isinstance(message.content, list):
            pieces.append(content_item(engine, part_dicts(message.content),
                                       f"{prefix}[{i}].content"))
        else:
            pieces.append(message.content or "")
    if not takes_images(engine):
        return None
    if body.chat_template is not None:
        raise bad_request("chat_template does not apply to this model: it embeds a chat's text "
                          "or image as they are (no template); leave chat_template unset.",
                          "chat_template")
    images = [p if isinstance(p, ImageRef) else p["multi_modal_data"]["image"]
              for p in pieces if not isinstance(p, str)]
    text = "".join(p if isinstance(p, str) else p.get("prompt", "") for p in pieces
                   if not isinstance(p, ImageRef))
    if len(images) > 1:
        raise bad_request(f"{prefix} holds {len(images)} images; a chat is embedded as one "
                          "item, which takes one image: send one chat per image.", "messages")
    if not images:
        if not text:
            raise bad_request(f"{prefix} has no text and no image to embed.", "messages")
        return text
    return {"prompt": text, "multi_modal_data": {"image": images[0]}} if text else images[0]
