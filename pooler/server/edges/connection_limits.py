"""Slow and vanished clients cost nothing: a connection cap, a header read timeout, a body read
timeout, keep-alive limits, and error logs that cannot flood the disk.

- `guarded_h11_protocol(...)`: uvicorn's h11 protocol with two additions. At
  --max-connections open connections, a new one makes room by evicting the connection that
  has been sending its request (head or body) or idling the longest, if that has lasted at
  least EVICT_AFTER s: dribblers cannot starve normal clients, who send a request in
  milliseconds. When no such connection exists (every connection is being answered), the
  new one is answered 503 and closed at once; either way its file descriptor is freed, so
  accept() keeps working. A connection must send a complete request head within
  --header-timeout seconds of connecting (or of its first byte after a keep-alive pause), else
  it gets 408 and is closed.
- `BodyTimeoutMiddleware`: the whole body must arrive within --body-timeout seconds of the
  request head, else 408 and the connection closes. It also answers 503 to a client still
  uploading when the graceful shutdown time is over.
- Idle keep-alive connections close after --keep-alive-timeout seconds (uvicorn's setting).
- `raise_fd_limit()`: the soft RLIMIT_NOFILE is raised to the hard limit at start, and the
  connection cap is kept below it, so dribblers can never exhaust file descriptors.
- `RateLimitFilter`: at most a few records per message per interval on the asyncio and uvicorn
  loggers (an accept loop failing with EMFILE used to log hundreds of thousands of lines).
"""
from __future__ import annotations

import asyncio
import logging
import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

from pooler.server.edges.auth import send_json
from pooler.server.errors import error_body

logger = logging.getLogger(__name__)

# File descriptors kept free of client connections: model files, logs, worker pipes.
FD_RESERVE = 128
# A connection sending its request (or idle) for this long may be evicted for a newcomer at
# the connection cap; a normal client sends its whole request far quicker.
EVICT_AFTER = 1.0


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard limit; returns the soft limit now set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # not allowed here: keep the soft limit
            pass
    return soft


def accept_backlog(fd_limit: int) -> int:
    """uvicorn's backlog for an fd limit. asyncio accepts up to `backlog` sockets in one go
    before any of their connection_made runs (where the cap is enforced), so a burst can hold
    that many fds above the cap: keep it a small part of the limit."""
    return max(64, min(2048, fd_limit // 8))


def fit_connection_cap(max_connections: int, fd_limit: int) -> int:
    """The connection cap actually used: below the fd limit by a reserve and room for two
    accept bursts (one being accepted while the previous one's refusals close)."""
    cap = max(1, min(max_connections, fd_limit - FD_RESERVE - 2 * accept_backlog(fd_limit)))
    if cap < max_connections:
        logger.warning("--max-connections %d lowered to %d: the open-files limit is %d "
                       "(raise it with `ulimit -n`)", max_connections, cap, fd_limit)
    return cap


def _raw_response(status: int, reason: str, body: dict, extra: str = "") -> bytes:
    import json

    payload = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\nconnection: close\r\n{extra}\r\n")
    return head.encode() + payload


_TOO_MANY = _raw_response(503, "Service Unavailable", error_body(
    503, "Too many open connections (--max-connections); retry shortly.", None,
    "too_many_connections"), "retry-after: 1\r\n")
_HEADER_TIMEOUT = _raw_response(408, "Request Timeout", error_body(
    408, "The request head did not arrive in time (--header-timeout).", None,
    "header_timeout"))


def guarded_h11_protocol(max_connections: int, header_timeout: float, metrics=None) -> type:
    """An H11Protocol subclass bound to these limits (uvicorn.Config(http=...) takes a
    class; the limits ride on it as class attributes)."""
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {
        "max_connections": max_connections, "header_timeout": header_timeout,
        "metrics": metrics})


class _GuardedH11Protocol(H11Protocol):
    max_connections: int = 1024
    header_timeout: float = 10.0
    metrics = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._reading_since = self.loop.time()  # start of the current head/body/idle phase
        if len(self.connections) > self.max_connections and not self._evict_one():
            if self.metrics is not None:
                self.metrics.connections_rejected.inc()
            logger.warning("refused a connection: %d open, the cap is %d (--max-connections)",
                           len(self.connections) - 1, self.max_connections)
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._track_open()
        self._arm_header_timer()

    def _evict_one(self) -> bool:
        """Close the connection that has been sending its request (or idling) the longest,
        if for at least EVICT_AFTER s; False when there is none (all are being answered)."""
        now = self.loop.time()
        victim = None
        for conn in list(self.connections):
            if conn is self or not isinstance(conn, _GuardedH11Protocol) or \
                    conn.transport.is_closing() or not conn._receiving():
                continue
            if now - conn._reading_since >= EVICT_AFTER and \
                    (victim is None or conn._reading_since < victim._reading_since):
                victim = conn
        if victim is None:
            return False
        if self.metrics is not None:
            self.metrics.client_timeouts.labels("evicted").inc()
        logger.warning("closed a connection slow to send its request (%.1f s) to make room "
                       "at the cap of %d (--max-connections)", now - victim._reading_since,
                       self.max_connections)
        if victim._waiting_for_head():
            victim.transport.write(_HEADER_TIMEOUT)
        victim.transport.close()  # mid-body: the handler sees a disconnect (499)
        victim.connections.discard(victim)
        return True

    def _receiving(self) -> bool:
        """Idle, or still receiving its request's head or body (nothing being computed)."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or \
            (cycle.more_body and not cycle.response_started)

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)
        self._track_open()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting_for_head():
            if self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()  # the first byte of a request after a keep-alive pause
                self._reading_since = self.loop.time()
        elif self._header_timer is not None:
            self._cancel_header_timer()  # the head is complete: the body phase begins
            self._reading_since = self.loop.time()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle now: uvicorn's keep-alive timer takes over until the next byte arrives.
        self._cancel_header_timer()
        self._reading_since = self.loop.time()

    # ---- helpers ------------------------------------------------------------------------
    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._waiting_for_head():
            return
        if self.metrics is not None:
            self.metrics.client_timeouts.labels("headers").inc()
        logger.info("closed a connection that sent no complete request head in %g s",
                    self.header_timeout)
        self.transport.write(_HEADER_TIMEOUT)
        self.transport.close()

    def _track_open(self) -> None:
        if self.metrics is not None:
            self.metrics.connections_open.set(len(self.connections))


class _BodyTimedOut(Exception):
    pass


class _ShutdownExpired(Exception):
    pass


class BodyTimeoutMiddleware:
    """Pure ASGI: the request body must be complete within `timeout` seconds of the head."""

    def __init__(self, app, timeout: float, gate=None, metrics=None):
        self.app = app
        self.timeout = timeout
        self.gate = gate
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        body_done = False
        started = False

        async def guarded_receive():
            nonlocal body_done
            if body_done:
                return await receive()
            waiters = {asyncio.ensure_future(receive())}
            expiry = None
            if self.gate is not None:
                expiry = asyncio.ensure_future(self.gate.wait_expired())
                waiters.add(expiry)
            try:
                done, _ = await asyncio.wait(waiters, timeout=max(0.0, deadline - loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.cancel()
            receiving = next(w for w in waiters if w is not expiry)
            if receiving not in done:
                raise _ShutdownExpired() if expiry in done else _BodyTimedOut()
            message = receiving.result()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracked_send)
        except _BodyTimedOut:
            if self.metrics is not None:
                self.metrics.client_timeouts.labels("body").inc()
            if not started:
                await send_json(send, 408, error_body(
                    408, f"The request body did not arrive within {self.timeout:g} s "
                    "(--body-timeout).", None, "body_timeout"), {"connection": "close"})
        except _ShutdownExpired:
            if not started:
                await self._refuse(send)
        except asyncio.CancelledError:
            # uvicorn's backstop cancelled a handler still running well past the graceful
            # timeout: answer 503 (not uvicorn's bare 500); the server is going down anyway.
            if self.gate is None or not self.gate.draining or started:
                raise
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        refusal = self.gate.refusal()
        await send_json(send, 503, error_body(503, refusal.message, None, refusal.code),
                        refusal.headers)


class RateLimitFilter(logging.Filter):
    """Lets at most `burst` records of one message template through per `interval` seconds,
    then one summary line with the number dropped."""

    def __init__(self, burst: int = 5, interval: float = 10.0):
        super().__init__()
        self.burst = burst
        self.interval = interval
        self._windows: dict[tuple, list] = {}  # key -> [window start, count]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        # The template's first line: asyncio's messages carry a per-socket repr after it.
        msg = record.msg.split("\n", 1)[0][:120] if isinstance(record.msg, str) \
            else type(record.msg)
        key = (record.name, msg)
        now = time.monotonic()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.interval:
            dropped = window[1] - self.burst if window is not None else 0
            if len(self._windows) > 1000:  # unbounded message texts must not grow this
                self._windows.clear()
            self._windows[key] = [now, 1]
            if dropped > 0:
                record.msg = f"{record.msg} [{dropped} similar messages suppressed]"
            return True
        window[1] += 1
        return window[1] <= self.burst


_FILTERED_LOGGERS = ("asyncio", "uvicorn.error", __name__,
                     "pooler.server.errors")


def install_log_rate_limit(burst: int = 5, interval: float = 10.0) -> RateLimitFilter:
    """Rate-limit warnings and errors of the loggers a client storm can trigger."""
    limiter = RateLimitFilter(burst, interval)
    for name in _FILTERED_LOGGERS:
        logging.getLogger(name).addFilter(limiter)
    return limiter
