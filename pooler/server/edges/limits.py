"""Request limits: body size (413), inputs per request (413), inputs in flight (503), and the
queue measured in tokens (503 with Retry-After; see TokenAdmission for the rule).

The payload limit is checked on Content-Length and again while the body streams in, so a
chunked upload cannot slip past it."""
from __future__ import annotations

import math
import threading
from typing import Callable

from pooler.engine.engine_loop import CancelledBeforeSubmit
from pooler.server.edges.auth import send_json
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


class QueueGateMiddleware:
    """Refuse a POST at once, from its Content-Length, when the token queue has no room for
    it (TokenAdmission.would_refuse): under a burst, reading and parsing hundreds of large
    bodies would itself keep the event loop (and /health) busy for seconds. Handlers still
    reserve and check the exact count; this only turns the obvious refusals away early.
    `shapes` (refusals.RefusalShapes) says which paths are gated (not the tokenizer routes)
    and shapes each refusal as the route's protocol does."""

    def __init__(self, app, admission: "TokenAdmission", shapes):
        self.app = app
        self.admission = admission
        self.shapes = shapes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" \
                and self.shapes.gated(scope["path"]):
            for name, value in scope.get("headers", ()):
                if name == b"content-length" and value.isdigit():
                    error = self.admission.would_refuse(int(value))
                    if error is not None:
                        response = self.shapes.response(scope.get("app"), scope["path"],
                                                        error)
                        return await response(scope, receive, send)
                    break
        return await self.app(scope, receive, send)


class Admission:
    """Counts inputs admitted and not yet answered. Runs on the event loop thread only."""

    def __init__(self, max_input_items: int, max_queue: int):
        self.max_input_items = max_input_items
        self.max_queue = max_queue
        self.in_flight = 0

    def check_count(self, num_items: int, field: str | None) -> None:
        """A 413 when one request holds more inputs than --max-input-items."""
        if num_items > self.max_input_items:
            where = f"'{field}' has" if field else "The request holds"
            raise APIError(413, f"{where} {num_items} items, more than this server's "
                           f"limit of {self.max_input_items} per request (--max-input-items); "
                           "split it into several requests.", param=field,
                           code="too_many_inputs")

    def admit(self, num_items: int, field: str) -> None:
        self.check_count(num_items, field)
        if self.in_flight + num_items > self.max_queue:
            raise APIError(503, f"The server is busy: {self.in_flight} inputs are queued and "
                           f"the limit is {self.max_queue} (--max-queue). Retry shortly.",
                           code="queue_full", headers={"retry-after": "1"})
        self.in_flight += num_items

    def release(self, num_items: int) -> None:
        self.in_flight -= num_items


class TokenAdmission:
    """Tokens admitted and not yet answered, across all clients; callable from any thread.

    The rule has two parts.
    1. The time bound: a request's tokens are admitted while `in_flight + its tokens <=
       limit()`, with
           limit = --max-queue-tokens when given, else
                   max(one step's token budget, measured tokens/s x --max-queue-seconds)
       where tokens/s is the engine's rate over its last steps (EngineLoop.tokens_per_second),
       so the limit follows the machine: a busy or throttled CPU admits less. Before the first
       step is measured the rate is taken as one step budget per FALLBACK_STEP_SECONDS. A
       request arriving when nothing is in flight is always admitted (one large request must
       not be refused forever).
    2. The steady-load floor: a small request (at most --small-request-inputs inputs; in
       tokens at most that many times the model's maximum length) is admitted whatever the
       queue holds while at most --small-request-slots requests are in flight. Closed-loop
       clients (each waits for its answer before sending again) then queue, as TEI and vLLM
       queue them, instead of being refused when the measured rate dips; the work this can
       add beyond the bound is capped at slots x inputs x max length tokens.
    An admitted large request is thus answered within about max_queue_seconds (plus the
    floor's work) plus its own compute time; everything beyond gets an immediate 503 whose
    Retry-After is the time the queue takes to drain at the measured rate.
    """

    # Before any step is measured: a full step is assumed to take this long (a CPU's order of
    # magnitude; the first measured step replaces the guess).
    FALLBACK_STEP_SECONDS = 1.0
    # JSON bytes per token for the early estimate: English WordPiece runs ~4-5 characters per
    # token, so this overestimates plain text a little; token-id bodies (~6 bytes per id)
    # are underestimated and settled by the exact count.
    BYTES_PER_TOKEN = 4

    def __init__(self, step_budget: int, rate: Callable[[], float | None],
                 max_queue_seconds: float, max_queue_tokens: int | None = None,
                 small_request_slots: int = 0, small_request_tokens: int = 0):
        self.step_budget = step_budget
        self.rate = rate
        self.max_queue_seconds = max_queue_seconds
        self.max_queue_tokens = max_queue_tokens
        self.small_request_slots = small_request_slots
        self.small_request_tokens = small_request_tokens
        self.in_flight = 0
        self.requests = 0  # Reservations open (requests admitted or being admitted)
        self._lock = threading.Lock()

    def limit(self) -> int:
        if self.max_queue_tokens is not None:
            return self.max_queue_tokens
        rate = self.rate()
        if rate is None:
            rate = self.step_budget / self.FALLBACK_STEP_SECONDS
        return max(self.step_budget, int(rate * self.max_queue_seconds))

    def floor_open(self) -> bool:
        """Whether a small request may still be admitted past the time bound."""
        return self.requests <= self.small_request_slots

    def open_request(self) -> None:
        with self._lock:
            self.requests += 1

    def close_request(self) -> None:
        with self._lock:
            self.requests -= 1

    def reserve_estimate(self, body_bytes: int, small: bool = False) -> int:
        """The early refusal, before a request is tokenized (which takes a worker thread
        and, under a burst, seconds): reserve body_bytes / BYTES_PER_TOKEN tokens, a rough
        guess corrected by reserve() once the real count is known. A request that may be
        small is not refused on its guess while the floor has room (a guess knows nothing of
        truncation): its exact count decides."""
        estimate = body_bytes // self.BYTES_PER_TOKEN
        if small and self.floor_open():
            with self._lock:
                self.in_flight += estimate
            return estimate
        return self.reserve(estimate)

    def would_refuse(self, body_bytes: int) -> APIError | None:
        """The 503 reserve_estimate would raise now, without reserving anything (from the
        body size alone: while the floor has room the handler decides)."""
        if self.floor_open() and self.small_request_slots:
            return None
        estimate = body_bytes // self.BYTES_PER_TOKEN
        if self.in_flight > 0 and self.in_flight + estimate > self.limit():
            return self._busy(estimate)
        return None

    def reserve(self, num_tokens: int, replacing: int = 0,
                request_tokens: int | None = None) -> int:
        """Admit num_tokens (in place of an earlier estimate of `replacing` tokens) or raise a
        503; returns what to release() when answered. request_tokens: the whole request's
        exact tokens so far when it is small by its inputs (the floor applies if they fit)."""
        with self._lock:
            limit = self.limit()
            others = self.in_flight - replacing
            small = request_tokens is not None and \
                request_tokens <= self.small_request_tokens and self.floor_open()
            if others > 0 and others + num_tokens > limit and not small:
                self.in_flight -= replacing  # the estimate leaves with the refused request
                raise self._busy(num_tokens, limit)
            self.in_flight = others + num_tokens
        return num_tokens

    def release(self, num_tokens: int) -> None:
        with self._lock:
            self.in_flight -= num_tokens

    def retry_after(self) -> int:
        """Seconds until the queue has drained at the measured rate (1 to 60)."""
        rate = self.rate()
        if not rate:
            return 1
        return min(60, max(1, math.ceil(self.in_flight / rate)))

    def _busy(self, num_tokens: int, limit: int | None = None) -> APIError:
        limit = self.limit() if limit is None else limit
        wanted = f" plus this request's {num_tokens}" if num_tokens else ""
        return APIError(503, f"The server is busy: {self.in_flight} tokens are queued{wanted}, "
                        f"over the limit of {limit} (about {self.max_queue_seconds:g} s of work "
                        "at the measured rate; --max-queue-seconds / --max-queue-tokens). "
                        "Retry after the Retry-After header's seconds.", code="queue_full",
                        headers={"retry-after": str(self.retry_after())})


class Reservation:
    """The tokens one call holds in a TokenAdmission: a guess from its body size at first,
    the exact counts once the engine has tokenized (admit, called before each submit), all
    released once, when the call ends or as soon as its client leaves (the worker thread may
    still be tokenizing then; it is refused at its next admit). small: the call has few
    enough inputs for the steady-load floor (TokenAdmission, part 2)."""

    def __init__(self, admission: TokenAdmission, body_bytes: int, small: bool = False):
        self.admission = admission
        self.small = small
        self._lock = threading.Lock()
        admission.open_request()
        try:
            self._estimate = admission.reserve_estimate(body_bytes, small)
        except APIError:
            admission.close_request()
            raise
        self._held = self._estimate
        self._exact = 0  # exact tokens admitted so far
        self._released = False

    def admit(self, num_tokens: int) -> None:
        with self._lock:
            if self._released:
                raise CancelledBeforeSubmit("the client left; its tokens were released")
            replacing, self._estimate = self._estimate, 0
            whole = self._exact + num_tokens if self.small else None
            try:
                self._held += self.admission.reserve(num_tokens, replacing, whole) - replacing
            except APIError:
                self._held -= replacing
                raise
            self._exact += num_tokens

    def release(self) -> None:
        with self._lock:
            if not self._released:
                self._released = True
                self.admission.release(self._held)
                self.admission.close_request()
