"""Every error leaves the server as JSON in the OpenAI shape:
{"error": {"message", "type", "param", "code"}}, with the offending field in `param`.

Bad input is a 4xx: pydantic validation errors and the engine's ValueErrors become 400.
Only a bug inside the server is a 500.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pooler.engine.engine_loop import RequestCancelled
from pooler.engine.lora import UnknownLoraError

logger = logging.getLogger(__name__)

# nginx's "client closed request": logged and counted, never read by anyone.
CLIENT_CLOSED_REQUEST = 499

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "request_too_large", 499: "client_closed_request",
          503: "service_unavailable", 500: "internal_error"}


# For the OpenAPI spec: what an error looks like on every route.
ERROR_RESPONSES = {code: {"description": text, "content": {"application/json": {"example": {
    "error": {"message": text, "type": _TYPES[code], "param": None, "code": None}}}}}
    for code, text in ((400, "invalid request"), (401, "missing or wrong API key"),
                       (404, "unknown model"), (413, "too many inputs or too large a body"),
                       (503, "queue full or model not loaded"))}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str = "invalid_value"):
    return APIError(400, message, param=param, code=code)


def unsupported(what: str, param: str | None = None) -> APIError:
    return APIError(400, f"This model/engine does not support {what}.", param=param,
                    code="unsupported_task")


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None):
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers)


def _field_path(loc: tuple) -> list[str]:
    """('body', 'input', 'list[str]', 0) -> ['input', '0']: drop the body marker and the
    names pydantic gives union members."""
    parts = []
    for item in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(item, str) and ("[" in item or item in ("str", "int", "bool", "float")
                                      or item.startswith("function-")):
            continue
        parts.append(str(item))
    return parts


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One readable sentence for a list of pydantic errors, and the top-level field."""
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('msg')}.", None
    path = _field_path(tuple(first.get("loc", ())))
    if not path:
        return f"Invalid request body: {first.get('msg')}.", None
    field = path[0]
    where = ".".join(path)
    if first.get("type") == "missing":
        return f"Missing required field '{where}'.", field
    # A union (e.g. `input`) yields one error per member: say what it accepts instead.
    same_field = [e for e in errors if _field_path(tuple(e.get("loc", ())))[:1] == [field]]
    if len(same_field) > 1 and field in ("input", "inputs", "queries", "documents", "text_1",
                                         "text_2", "ids"):
        return (f"Invalid '{field}': expected a string, a list of strings, a list of token ids "
                f"or a list of token-id lists (first problem at '{where}': "
                f"{first.get('msg')}).", field)
    return f"Invalid '{where}': {first.get('msg')}.", field


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(UnknownLoraError)
    async def _unknown_lora(request: Request, exc: UnknownLoraError):
        return error_response(404, str(exc), "model", "model_not_found")

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError):
        return error_response(400, str(exc), None, "invalid_value")

    @app.exception_handler(RequestCancelled)
    async def _cancelled(request: Request, exc: RequestCancelled):
        return error_response(CLIENT_CLOSED_REQUEST, str(exc), None, "client_closed_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = {404: f"No route {request.url.path}.",
                   405: f"Method {request.method} is not allowed on {request.url.path}."}.get(
            exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, None, None,
                              getattr(exc, "headers", None))

    @app.exception_handler(RuntimeError)
    async def _engine_failure(request: Request, exc: RuntimeError):
        logger.error("engine failure on %s: %s", request.url.path, exc)
        return error_response(500, f"The engine failed on this request: {exc}", None,
                              "engine_error")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        logger.exception("internal error on %s", request.url.path)
        return error_response(500, f"Internal server error: {type(exc).__name__}.", None,
                              "internal_error")
