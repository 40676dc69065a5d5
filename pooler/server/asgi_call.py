"""One HTTP request through an ASGI app in process, without a socket: the gRPC server runs
its TEI calls through the HTTP routes this way (pooler/server/grpc/server.py), and the
multi-model front door reads each model's GET routes (pooler/server/multi_model.py)."""
from __future__ import annotations

import asyncio


async def call_asgi(app, scope: dict, body: bytes = b"") -> tuple[int, bytes]:
    """(status, body) of `app`'s answer to `scope` with request body `body`. The body is sent
    once; the next receive() waits until the answer is complete and then reports the client's
    disconnect, as a client that stays for its answer would (a route that watches for
    disconnects must not see one early)."""
    sent = False
    answered = asyncio.Event()
    status, chunks = 500, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(scope, receive, send)
    finally:
        answered.set()
    return status, b"".join(chunks)
