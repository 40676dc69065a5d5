"""Errors on vLLM's routes, shaped as vLLM's server shapes them.

vLLM answers {"error": {"message", "type", "param", "code"}} with `code` the HTTP status as an
integer and `type` the error's class name (BadRequestError, NotFoundError, ...); a body that
fails schema validation is type "Bad Request" and its message carries pydantic's error list
(e.g. 'literal_error' and the rejected value). Routes built with `VLLMRoute` convert pooler's
errors to that shape; the app-wide handlers (errors.py) keep the OpenAI/pooler shape elsewhere.

A shared path that hands a TEI body to TEI's handler marks the request with `use_tei_errors`,
and its errors then go to the app-wide handlers untouched.
"""
from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError

from pooler.engine.engine_loop import RequestCancelled
from pooler.engine.input_processor import InputTooLongError
from pooler.server.errors import APIError, validation_message

# vLLM's error class names by status (vllm/entrypoints/openai serving's err_type values).
_TYPES = {400: "BadRequestError", 401: "UnauthorizedError", 404: "NotFoundError",
          413: "RequestEntityTooLargeError", 499: "ClientClosedRequest",
          500: "InternalServerError", 503: "ServiceUnavailableError"}
_VALIDATION_TYPE = HTTPStatus.BAD_REQUEST.phrase  # "Bad Request", as vLLM's handler says

_DIALECT_KEY = "pooler.error_dialect"


def use_tei_errors(request: Request) -> None:
    """This request is answered by a TEI handler: leave its errors to TEI's shape."""
    request.scope[_DIALECT_KEY] = "tei"


def vllm_error_body(status: int, message: str, param: str | None = None,
                    err_type: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message,
                      "type": err_type or _TYPES.get(status, "BadRequestError"),
                      "param": param, "code": status}}


def vllm_error(status: int, message: str, param: str | None = None,
               err_type: str | None = None, headers: dict[str, str] | None = None,
               extra: dict[str, Any] | None = None) -> JSONResponse:
    body = vllm_error_body(status, message, param, err_type)
    if extra:
        body.update(extra)
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_error(errors: list[dict]) -> JSONResponse:
    """Our sentence naming the field, then the error list as vLLM appends it."""
    sentence, param = validation_message(errors)
    cause = (errors[0].get("ctx") or {}).get("error") if errors else None
    if param is None and getattr(cause, "field", None):
        sentence, param = str(cause), cause.field  # a validator's error about one field
    details = [{k: e[k] for k in ("type", "loc", "msg", "input") if k in e} for e in errors]
    return vllm_error(400, f"{sentence} {details}", param, _VALIDATION_TYPE)


def too_long_message(exc: InputTooLongError) -> str:
    return (f"This model's maximum context length is {exc.max_length} tokens. However, input "
            f"{exc.index} has {exc.num_tokens} tokens. Please reduce the length of the input "
            "prompt, or ask for truncation with truncate_prompt_tokens (-1: the model's "
            "maximum).")


class VLLMRoute(APIRoute):
    """An APIRoute whose errors leave in vLLM's shape (FastAPI's documented way to handle one
    router's errors differently)."""

    dialect = "vllm"  # pooler/server/dialects/by_path.py

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request):
            try:
                return await handler(request)
            except RequestCancelled:
                raise  # logged and counted as 499 by the app-wide handler
            except Exception as exc:  # noqa: BLE001 - converted below or re-raised
                if request.scope.get(_DIALECT_KEY) == "tei":
                    raise
                response = to_vllm_response(exc)
                if response is None:
                    raise
                return response

        return route


def to_vllm_response(exc: Exception) -> JSONResponse | None:
    if isinstance(exc, RequestValidationError):
        return _validation_error(list(exc.errors()))
    if isinstance(exc, ValidationError):
        return _validation_error(list(exc.errors()))
    if isinstance(exc, APIError):
        return vllm_error(exc.status, exc.message, exc.param, headers=exc.headers)
    if isinstance(exc, InputTooLongError):
        return vllm_error(400, too_long_message(exc))
    if isinstance(exc, ValueError):
        return vllm_error(400, str(exc))
    return None  # a bug or an engine failure: the app-wide handlers log it (500)
