"""What every handler shares: the engine, the limits, the worker threads, and `respond()`,
which runs a blocking Engine call off the event loop and aborts it if the client leaves.

Engine methods block (they tokenize, then wait on the engine loop's futures), so they run in a
thread pool; the event loop only parses JSON and writes responses. Response bodies are also
serialized in the worker thread: a 1,000-vector JSON body must not stall other clients.
"""
from __future__ import annotations

import asyncio
import base64
import inspect
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from pooler.engine.engine_loop import CallContext, RequestCancelled, current_call
from pooler.engine.input_processor import normalize_inputs
from pooler.params import PoolingParams
from pooler.server.edges.limits import Admission, Reservation, TokenAdmission
from pooler.server.edges.shutdown import ShutdownGate
from pooler.server.errors import APIError, bad_request, unsupported
from pooler.server.media import MediaResolver, refs_in, resolve_items
from pooler.server.observability.metrics import ServerMetrics
from pooler.server.settings import ServerSettings

# Threads for the tokenizer-only routes: tokenizing a request takes milliseconds.
TOKENIZER_WORKERS = 4


# The LoRA adapter the request's `model` named (None: the base), set by check_model in the
# handler and read by respond() in the same request's task: every route that checks `model`
# runs its engine calls with that adapter, without an argument through each handler.
_request_lora: ContextVar[str | None] = ContextVar("pooler_request_lora", default=None)
# Bytes of the request body that were image URLs (data: URLs mostly), set by resolve_images:
# respond() leaves them out of the body-size token estimate (an image costs its patches, known
# once processed, not a token per 4 bytes of base64).
_request_media_bytes: ContextVar[int] = ContextVar("pooler_request_media_bytes", default=0)


class ServerState:
    def __init__(self, engine, settings: ServerSettings, metrics: ServerMetrics):
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        # What clients see: the served name, else the model's name, never a local path
        # unless the operator asks (--show-model-path).
        self.model_name = settings.served_model_name or \
            display_name(str(engine.model_config.model))
        self.model_root = (str(engine.model_config.path) if settings.show_model_path
                           else self.model_name)
        # Clients may name the model by its served name or by what it was loaded from.
        self.model_names = {self.model_name, str(engine.model_config.model),
                            str(engine.model_config.path)}
        self.admission = Admission(settings.max_input_items, settings.max_queue)
        self.token_admission = TokenAdmission(
            engine.config.scheduler_config.max_num_batched_tokens,
            getattr(engine, "tokens_per_second", lambda: None),
            settings.max_queue_seconds, settings.max_queue_tokens,
            small_request_slots=settings.small_request_slots,
            small_request_tokens=settings.small_request_inputs
            * engine.model_config.max_model_len)
        self.executor = ThreadPoolExecutor(settings.max_workers,
                                           thread_name_prefix="pooler-http")
        # Requests that need no model step (/tokenize, /detokenize, /decode) run here: they
        # never wait behind model calls for a thread, nor count against the model's queue.
        self.tokenizer_executor = ThreadPoolExecutor(TOKENIZER_WORKERS,
                                                     thread_name_prefix="pooler-tokenize")
        # Images named in requests: fetched and decoded on threads of their own (media.py).
        self.media = MediaResolver(settings)
        self.ready = False
        self.started_at = time.time()
        self.shutdown = ShutdownGate()

    # ---- checks (event loop; cheap) -----------------------------------------------------
    def check_model(self, model: str | None) -> None:
        """404 unless `model` names the served model or one of its LoRA adapters; an adapter
        is then what this request's engine calls run with."""
        adapters = self.lora_names
        if model is not None and model not in self.model_names and model not in adapters:
            also = f" and the LoRA adapters {adapters}" if adapters else ""
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                           f"`{self.model_name}`{also}.", param="model", code="model_not_found")
        _request_lora.set(model if model in adapters else None)

    def pick_lora(self, model: str | None) -> None:
        """On routes where any model name is accepted (TEI's and Cohere's rule, for clients set
        up for another server): run this request with the adapter `model` names. A server
        with LoRA enabled checks the name as check_model does: there `model` chooses the
        weights, so a misspelt adapter must be a 404, never the base model's answer."""
        if getattr(self.engine, "lora_enabled", False):
            self.check_model(model)
        elif model is not None and model in self.lora_names:  # the model's task adapters
            _request_lora.set(model)

    def task_adapter(self, task: str | None, field: str = "task") -> dict[str, str]:
        """Engine.embed's keywords for a request's task adapter (Jina's `task`): {} for none,
        a 400 naming `field` for a name the model does not carry."""
        if task is None:
            return {}
        try:
            self.engine.check_task_adapter(task)
        except (AttributeError, ValueError) as exc:
            message = str(exc) if isinstance(exc, ValueError) else \
                f"task={task!r}: this model carries no task adapters."
            raise bad_request(message, field) from None
        return {"task": task}

    @property
    def lora_names(self) -> list[str]:
        return list(getattr(self.engine, "lora_names", []))

    def require(self, method: str, task: str | None = None, what: str | None = None) -> None:
        """400 unless the engine has `method` (other branches add some) and the model
        supports `task`."""
        what = what or method
        if not callable(getattr(self.engine, method, None)):
            raise unsupported(f"{what} (no Engine.{method} in this build)")
        if task is not None and task not in self.engine.supported_tasks:
            raise unsupported(f"{what}: task {task!r} is not among this model's tasks "
                              f"{sorted(self.engine.supported_tasks)}", param="task")

    def inputs(self, raw: Any, field: str) -> list:
        try:
            return normalize_inputs(raw, field)
        except ValueError as exc:
            raise bad_request(str(exc), field) from None

    def check_dimensions(self, dimensions: int | None, task: str = "embed") -> None:
        """400 naming `dimensions` before any work is admitted. The engine's verify_params
        decides (positive, at most the model's vector size for `task`); this only maps its
        ValueError to the field. Run after `require`, so `task` itself is known good."""
        if dimensions is None:
            return
        try:
            self.engine.verify_params(PoolingParams(task=task, dimensions=dimensions))
        except ValueError as exc:
            raise bad_request(str(exc), "dimensions") from None

    def truncation(self, body, only_set: bool = False) -> dict[str, Any]:
        """Engine kwargs from a body's truncate / truncate_prompt_tokens /
        truncation_direction. only_set: just the fields the client sent (for Engine methods
        from other branches, whose signatures may lack some)."""
        out: dict[str, Any] = {}
        fields = [f for f in ("truncate", "truncate_prompt_tokens", "truncation_direction")
                  if f in type(body).model_fields]
        for name in fields:
            if only_set and name not in body.model_fields_set:
                continue
            value = getattr(body, name)
            if name == "truncate":
                value = bool(value)
            elif name == "truncation_direction":
                value = value.lower()
            elif value == -1:
                value = None  # vLLM: -1 means the model's maximum
            elif value is not None and value <= 0:
                raise bad_request("truncate_prompt_tokens must be a positive integer or -1, "
                                  f"got {value}.", name)
            elif value is not None and value < self.min_truncation() - 1:
                # Fewer than the special tokens: the tokenizer cannot cut to it.
                raise bad_request(f"truncate_prompt_tokens must be -1 or at least "
                                  f"{self.min_truncation() - 1} (the model's special tokens), "
                                  f"got {value}.", name)
            out[name] = value
        if "truncate_prompt_tokens" in body.model_fields_set \
                and body.truncate_prompt_tokens is not None and "truncate" in out:
            # vLLM's truncate_prompt_tokens asks for truncation (-1: at the model's maximum):
            # it wins over `truncate: false`, which refuses over-long inputs only without it.
            out["truncate"] = True
        return out

    def min_truncation(self) -> int:
        """The fewest tokens a truncation may cut a text to: its special tokens plus one."""
        try:
            return self.engine.tokenizer.num_special_tokens_to_add(pair=False) + 1
        except Exception:  # a tokenizer without the count: one token
            return 1

    def call(self, method: str, *args, **kwargs):
        """Call Engine.method with the kwargs its signature takes. Methods from other branches
        may lack some options: `use_tqdm` and options left at None are then dropped; an option
        the client did set is a 400 naming it, never silently ignored."""
        fn = getattr(self.engine, method)
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        final = {}
        for key, value in kwargs.items():
            if takes_any or key in params:
                final[key] = value
            elif key == "use_tqdm" or value is None or (key == "truncation_direction"
                                                         and value == "right"):
                continue  # an option left at its default needs no support
            else:
                raise unsupported(f"the option '{key}' on {method}", param=key)
        return fn(*args, **final)

    async def resolve_images(self, items: list) -> tuple[list, dict]:
        """`items` with their images (media.ImageRef) fetched and decoded, off the event loop;
        a bad image is a 400 naming it."""
        if refs_in(items):  # before fetching anything (text-only bodies: admit names the field)
            self.admission.check_count(len(items), None)
        items, resolved = await resolve_items(self.media, items)
        _request_media_bytes.set(sum(len(ref.url) for ref in resolved))
        return items, resolved

    # ---- running work -------------------------------------------------------------------
    async def respond(self, request: Request, num_items: int, field: str,
                      compute: Callable[[], Any], model_step: bool = True) -> Response:
        """Admit `num_items` inputs, run `compute` (blocking: Engine calls + building the
        body) in a worker thread, and answer with its JSON. A client that disconnects first
        has its queued engine requests aborted and gets nothing (logged as 499); when the
        graceful shutdown time runs out first, the same abort happens and the client gets
        503 with Retry-After (see edges/shutdown.py). model_step=False (the tokenizer routes):
        nothing is admitted and the work runs on the tokenizer threads."""
        if self.shutdown.expired:
            raise self.shutdown.refusal()
        if not model_step:
            return await self._respond_tokenizer_only(compute)
        body_bytes = request.headers.get("content-length", "0")
        body_bytes = int(body_bytes) if body_bytes.isdigit() else 0
        tokens = Reservation(self.token_admission,
                             max(0, body_bytes - _request_media_bytes.get()),
                             small=num_items <= self.settings.small_request_inputs)
        try:
            self.admission.admit(num_items, field)
        except APIError:
            tokens.release()
            raise
        self.metrics.inputs_in_flight.set(self.admission.in_flight)
        call = CallContext(cancel=threading.Event(), admit=tokens.admit,
                           lora=_request_lora.get())
        # For the metrics, traces and logs written when the answer is sent (observability/).
        request.scope["pooler.call"], request.scope["pooler.num_items"] = call, num_items

        def work() -> bytes | Response:
            if call.cancel.is_set():  # cancelled while queued for a worker thread
                raise RequestCancelled("cancelled before it started")
            token = current_call.set(call)
            try:
                result = compute()
                # A ready Response (a binary body) goes out as is; anything else is JSON.
                return result if isinstance(result, Response) else _to_json(result)
            finally:
                current_call.reset(token)

        loop = asyncio.get_running_loop()
        watcher = expiry = None
        try:
            future = loop.run_in_executor(self.executor, work)
            watcher = asyncio.ensure_future(_wait_for_disconnect(request))
            expiry = asyncio.ensure_future(self.shutdown.wait_expired())
            done, _ = await asyncio.wait({future, watcher, expiry},
                                         return_when=asyncio.FIRST_COMPLETED)
            if future not in done:
                client_left = watcher in done
                call.cancel.set()  # the engine aborts what has not started computing
                tokens.release()   # room for other clients now, not when the thread ends
                try:
                    body = await future
                except RequestCancelled:
                    body = None
                if client_left:
                    raise RequestCancelled("client disconnected; its queued inputs were "
                                           "aborted")
                if body is None:
                    raise self.shutdown.refusal()
            else:
                body = future.result()
        except asyncio.CancelledError:
            call.cancel.set()  # cancelled by the web server: stop the engine work too
            raise
        finally:
            tokens.release()
            for task in (watcher, expiry):
                if task is not None:
                    task.cancel()
            self.admission.release(num_items)
            self.metrics.inputs_in_flight.set(self.admission.in_flight)
            if call.tokenize_seconds:
                self.metrics.tokenize_time.observe(call.tokenize_seconds)
        if isinstance(body, Response):
            return body
        return Response(body, media_type="application/json")


    async def _respond_tokenizer_only(self, compute: Callable[[], Any]) -> Response:
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self.tokenizer_executor,
                                          lambda: _to_json(compute()))
        return Response(body, media_type="application/json")


def display_name(model: str) -> str:
    """A model argument as clients should see it: a hub or package name as given, a local
    folder (absolute, relative or ~) by its folder's name only."""
    path = Path(model).expanduser()
    if path.is_absolute() or model.startswith(("./", "../", "~")) or path.exists():
        return path.resolve().name or model
    return model


async def _wait_for_disconnect(request: Request) -> None:
    # The body is already read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _to_json(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        raise bad_request("The model produced non-finite values (NaN or infinity) for this "
                          "input; check the input and the model's dtype.",
                          code="non_finite_output") from None


def vector(array: np.ndarray, encoding_format: str):
    """A float32 vector (or matrix) as a JSON list, or base64 of its little-endian bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(array, dtype="<f4").tobytes()).decode()
    return array.tolist()


def usage(num_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": int(num_tokens), "total_tokens": int(num_tokens)}
