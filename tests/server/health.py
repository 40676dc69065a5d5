"""Wait for a server under test to answer GET /health with 200 (in-thread or subprocess)."""
from __future__ import annotations

import time
from typing import Callable

import httpx


def wait_until_healthy(url: str, timeout: float, is_alive: Callable[[], bool],
                       poll_interval: float = 0.05) -> None:
    """Poll `{url}/health` until it answers 200.

    is_alive: False once the server's thread or process has ended, so a crash fails at once
    instead of after `timeout`. Raises RuntimeError on a dead server or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        if not is_alive():
            raise RuntimeError(f"the server at {url} stopped before it became healthy")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server at {url} was not healthy after {timeout:g} s")
        time.sleep(poll_interval)
