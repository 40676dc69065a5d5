"""One refusal shape per protocol, for the refusals made before a route's handler runs
(QueueGateMiddleware, pooler/server/edges/limits.py): the route a path belongs to decides.

- TEI routes: TEI's {"error", "error_type"}: 429 "Overloaded" for a full queue, 503
  "Unhealthy" otherwise (shutting down).
- vLLM routes: vLLM's {"error": {"message", "type", "param", "code": <status>}}.
- Cohere routes: Cohere's {"message"}.
- Anything else: pooler's OpenAI shape (errors.py).
Every refusal carries the error's Retry-After. Paths shared by two protocols and told apart
by their body (/embed: TEI or Cohere; /rerank: vLLM or TEI) get no early refusal: their
handler refuses once the body says which protocol it is (same shapes, same header).
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

from pooler.server.dialects.by_path import route_dialects
from pooler.server.dialects.tei import as_tei_error
from pooler.server.dialects.vllm.errors import to_vllm_response
from pooler.server.errors import APIError, error_response

# Paths that need no model step: never gated, never counted in the model's queue.
NO_MODEL_STEP = frozenset({"/tokenize", "/detokenize", "/decode"})
# Told apart by body shape: left to the handler.
_BY_BODY = frozenset({"/embed", "/rerank"})


class RefusalShapes:
    """path -> how a refusal on it is shaped, read from the app's routes on first use."""

    def __init__(self):
        self._protocols: dict[str, str] | None = None

    def _protocol(self, app, path: str) -> str:
        if self._protocols is None:
            self._protocols = route_dialects(getattr(app, "routes", ()))
        return self._protocols.get(path, "openai")

    def gated(self, path: str) -> bool:
        """Whether the early queue refusal applies to this path."""
        return path not in NO_MODEL_STEP and path not in _BY_BODY

    def response(self, app, path: str, error: APIError) -> JSONResponse:
        protocol = self._protocol(app, path)
        if protocol == "tei":
            refusal = as_tei_error(error)
            if refusal is not None:
                return refusal.response()
        if protocol == "vllm":
            return to_vllm_response(error)
        if protocol == "cohere":
            return JSONResponse({"message": error.message}, status_code=error.status,
                                headers=error.headers)
        return error_response(error.status, error.message, error.param, error.code,
                              error.headers)
