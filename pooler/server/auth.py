"""`--api-key`: every route but the health checks (/health, /ping, GET /) needs
`Authorization: Bearer KEY` (pure ASGI)."""
from __future__ import annotations

import hmac

from pooler.server.errors import error_body

OPEN_PATHS = frozenset({"/health", "/ping"})


class APIKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

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
            return await send_json(send, 401, error_body(401, message, None, "invalid_api_key"),
                                   {"www-authenticate": "Bearer"})
        return await self.app(scope, receive, send)


async def send_json(send, status: int, body: dict, headers: dict[str, str] | None = None):
    import json

    payload = json.dumps(body).encode()
    raw_headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
