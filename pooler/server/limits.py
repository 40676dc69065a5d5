"""Request limits: body size (413), inputs per request (413), inputs in flight (503).

The payload limit is checked on Content-Length and again while the body streams in, so a
chunked upload cannot slip past it."""
from __future__ import annotations

from pooler.server.auth import send_json
from pooler.server.errors import APIError, error_body


class PayloadLimitMiddleware:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._reject(send, int(value))
        # Read the body up front (the JSON routes need all of it anyway), then replay it.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._reject(send, size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # afterwards: http.disconnect when the client leaves

        return await self.app(scope, replay, send)

    async def _reject(self, send, size: int):
        message = (f"Request body of {size} bytes is larger than the server's limit of "
                   f"{self.max_bytes} bytes (--max-payload-bytes); send fewer inputs per "
                   "request.")
        await send_json(send, 413, error_body(413, message, None, "payload_too_large"))


class Admission:
    """Counts inputs admitted and not yet answered. Runs on the event loop thread only."""

    def __init__(self, max_input_items: int, max_queue: int):
        self.max_input_items = max_input_items
        self.max_queue = max_queue
        self.in_flight = 0

    def admit(self, num_items: int, field: str) -> None:
        if num_items > self.max_input_items:
            raise APIError(413, f"'{field}' has {num_items} items, more than this server's "
                           f"limit of {self.max_input_items} per request (--max-input-items); "
                           "split it into several requests.", param=field,
                           code="too_many_inputs")
        if self.in_flight + num_items > self.max_queue:
            raise APIError(503, f"The server is busy: {self.in_flight} inputs are queued and "
                           f"the limit is {self.max_queue} (--max-queue). Retry shortly.",
                           code="queue_full", headers={"retry-after": "1"})
        self.in_flight += num_items

    def release(self, num_items: int) -> None:
        self.in_flight -= num_items
