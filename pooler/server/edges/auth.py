"""`--api-key`: every route but the health checks (/health, /ping, GET /) needs
`Authorization: Bearer KEY` (pure ASGI). The 401 is shaped as the route's own errors are (vLLM,
TEI, Cohere or OpenAI shape), so a client's error handling sees the body it expects."""
from __future__ import annotations

import hmac

from pooler.server.dialects.by_path import error_payload, route_dialects

OPEN_PATHS = frozenset({"/health", "/ping"})


class APIKeyMiddleware:
    def __init__(self, app, api_key: str, routes=()):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()
        self._routes = routes  # the app's route table, read at the first 401 (all added by then)
        self._dialects: dict[str, str] | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or (
                scope["path"] == "/" and scope.get("method") == "GET"):
            return await self.app(scope, receive, send)
        supplied = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                supplied = value
                break
        # Constant time: the comparison never tells how many leading bytes were right.
        if not hmac.compare_digest(supplied, self._expected):
            message = ("Missing API key: send 'Authorization: Bearer <key>'." if not supplied
                       else "Invalid API key.")
            if self._dialects is None:
                self._dialects = route_dialects(self._routes)
            body = error_payload(self._dialects.get(scope["path"], "openai"), 401, message,
                                 "Unauthorized", "invalid_api_key")
            return await send_json(send, 401, body, {"www-authenticate": "Bearer"})
        return await self.app(scope, receive, send)


async def send_json(send, status: int, body: dict, headers: dict[str, str] | None = None):
    import json

    payload = json.dumps(body).encode()
    raw_headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
