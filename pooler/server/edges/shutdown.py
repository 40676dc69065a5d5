"""Bounded shutdown: SIGTERM or SIGINT ends the process within --graceful-timeout plus a few
seconds, whatever is in flight.

1. The first signal stops accepting connections (uvicorn closes idle keep-alive ones) and
   `ShutdownGate.begin()` marks the server draining: /health answers 503.
2. In-flight requests have --graceful-timeout seconds to finish normally.
3. Then `ShutdownGate.expire()`: every waiting handler cancels its engine call (the engine
   aborts its queued requests, so it stops computing them) and answers 503 with Retry-After;
   a client still sending its body gets the same 503. Handlers return within moments, so
   uvicorn's own cancellation (which would answer a bare 500) is only a backstop, set a few
   seconds later.
4. The app's lifespan then stops the engine loop; anything still unfinished there is
   cancelled, so no worker thread waits forever and the process exits 0.

A second signal exits at once (status 128 + signal number), without waiting for anything.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys

import uvicorn

from pooler.server.errors import APIError

logger = logging.getLogger(__name__)

# Seconds uvicorn waits past the graceful timeout before cancelling handlers itself: ours
# answer 503 long before (they only wait for the engine to drop the aborted work).
BACKSTOP_SECONDS = 5.0
# What a refused client is told: another replica (or this one, restarted) will take it.
RETRY_AFTER_SECONDS = 1


class ShutdownGate:
    """What handlers see of a shutdown. Used on the event loop thread only."""

    def __init__(self):
        self.draining = False
        self._expired = asyncio.Event()

    @property
    def expired(self) -> bool:
        return self._expired.is_set()

    def begin(self) -> None:
        self.draining = True

    def expire(self) -> None:
        self.draining = True
        if not self._expired.is_set():
            logger.warning("graceful shutdown time is over: aborting the requests still in "
                           "flight (they get 503)")
        self._expired.set()

    async def wait_expired(self) -> None:
        await self._expired.wait()

    @staticmethod
    def refusal() -> APIError:
        return APIError(503, "The server is shutting down and stopped this request before it "
                        "finished; retry it (on another replica, or once this one is back).",
                        code="shutting_down",
                        headers={"retry-after": str(RETRY_AFTER_SECONDS),
                                 "connection": "close"})


class GracefulServer(uvicorn.Server):
    """uvicorn.Server with the bounded shutdown above. `config.timeout_graceful_shutdown` is
    the backstop; `graceful_timeout` is when the gate expires."""

    def __init__(self, config: uvicorn.Config, gate: ShutdownGate, graceful_timeout: float):
        super().__init__(config)
        self.gate = gate
        self.graceful_timeout = graceful_timeout
        self.signalled = False  # a signal (not a test or the caller) ended the server

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:
            # The operator insists: no more waiting on clients, the engine or thread joins.
            print(f"pooler: second signal {sig}, exiting now", file=sys.stderr, flush=True)
            os._exit(128 + sig)
        # Unlike uvicorn, the signal is not re-raised after the shutdown: a graceful
        # shutdown exits with status 0.
        self.signalled = True
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        self.gate.begin()
        timer = asyncio.get_running_loop().call_later(self.graceful_timeout, self.gate.expire)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def uvicorn_backstop(graceful_timeout: float) -> float:
    """uvicorn's own timeout_graceful_shutdown for a given --graceful-timeout."""
    return graceful_timeout + BACKSTOP_SECONDS
