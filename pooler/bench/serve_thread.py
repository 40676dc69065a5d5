"""Serve an Engine over HTTP from a thread of this process (bench tools that look inside the
engine while clients hit it: the soak checks its caches)."""
from __future__ import annotations

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def serve_in_thread(engine, settings=None, timeout: float = 120.0):
    """Yield the base URL of a uvicorn server for create_app(engine, settings) on a free
    loopback port; the engine's loop keeps running afterwards (the caller shuts it down)."""
    import httpx
    import uvicorn

    from pooler.server.app import create_app

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(engine, settings, owns_engine=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {url} did not start")
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
