"""Runs the engine core in one background thread so many callers share its batches.

Callers (server handlers, threads of a user's program) submit requests and wait on futures;
the loop thread alone touches the scheduler and the model, draining an inbox before each step.
This is continuous batching: requests from different callers land in the same forward pass.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable

from pooler.engine.core import EngineCore
from pooler.engine.request import Request, RequestOutput, RequestTiming

logger = logging.getLogger(__name__)


class RequestCancelled(Exception):
    """The caller went away (or cancelled); its outstanding requests were aborted."""


class CancelledBeforeSubmit(RequestCancelled):
    """Cancelled before anything of this call was submitted: no request of it exists in the
    engine, so nothing of it will release state it depends on (e.g. a cached ColBERT query)."""


# Called after each step with (number of requests computed, tokens computed, seconds).
StepListener = Callable[[int, int, float], None]
# Called once per finished request with the seconds from its creation (Request.arrival_time,
# just before submit) to the start of the step that computed it: inbox + scheduler wait.
QueueListener = Callable[[float], None]
# Called once per finished request (failed ones too: `error` set), its `timing` filled in.
FinishListener = Callable[[RequestOutput], None]


@dataclass
class CallContext:
    """Per-call facts a caller (the HTTP server) hands to Engine methods without new
    parameters: every Engine method that reaches run_processed honours `cancel`, calls
    `admit(num_tokens)` before it submits (the server's token admission: it raises to refuse),
    and tokenizing (pooler/engine/tasks/common.py) adds its time to `tokenize_seconds`.
    run_processed counts the inputs it submits by task (`submitted`) and keeps the outputs
    that came back (`finished`, with their timing): the server's metrics, logs and traces
    read them. `lora` names the LoRA adapter every request of the call runs with (None: the
    base model)."""
    cancel: threading.Event | None = None
    tokenize_seconds: float = 0.0
    admit: Callable[[int], None] | None = None
    submitted: Counter = field(default_factory=Counter)
    finished: list[RequestOutput] = field(default_factory=list)
    lora: str | None = None


# Steps the throughput estimate averages over (a few seconds of work on a CPU).
_RATE_WINDOW_STEPS = 32

# Set by the caller in the thread that runs the Engine method (contextvars are per thread).
current_call: ContextVar[CallContext | None] = ContextVar("pooler_current_call", default=None)


class EngineLoop:
    def __init__(self, core: EngineCore):
        self.core = core
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[str, Future] = {}
        self._submitted_at: dict[str, float] = {}
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.step_listeners: list[StepListener] = []
        self.queue_listeners: list[QueueListener] = []
        self.finish_listeners: list[FinishListener] = []
        # Tokens submitted and not yet finished (inbox + waiting + running), any thread.
        self._queued_tokens = 0
        self._queued_lock = threading.Lock()
        # (tokens, seconds) of recent steps: the measured rate admission limits derive from.
        self._recent_steps: deque[tuple[int, float]] = deque(maxlen=_RATE_WINDOW_STEPS)
        self.idle_listeners: list[Callable[[], None]] = []

    @property
    def queued_tokens(self) -> int:
        """Tokens of requests submitted and not finished yet (a queue measured in tokens)."""
        return self._queued_tokens

    def tokens_per_second(self) -> float | None:
        """Tokens computed per second of step time over the last steps; None before any."""
        steps = list(self._recent_steps)
        seconds = sum(s for _, s in steps)
        return sum(t for t, _ in steps) / seconds if seconds > 0 else None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_unfinished(self) -> int:
        return len(self._futures)

    def start(self) -> None:
        if self.is_running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pooler-engine-loop",
                                        daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Finish in-flight requests (up to `timeout` s), then stop the thread. Whatever is
        still unfinished then is cancelled, so no caller waits forever on a stopped loop."""
        if not self.is_running:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while (self._futures or not self._inbox.empty()) and \
                (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)
        self._stopping = True
        self._wakeup.set()
        # A step in progress finishes first (encoder steps are short and bounded in tokens).
        self._thread.join(None if deadline is None else max(1.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            logger.warning("engine loop still inside a step at shutdown; cancelling its "
                           "requests anyway")
        self._cancel_unfinished()

    def _cancel_unfinished(self) -> None:
        """Cancel the futures of requests that will never run (the loop has stopped): their
        waiters raise RequestCancelled instead of blocking an executor shutdown forever."""
        while True:  # submitted but never drained
            try:
                kind, _, future = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                future.cancel()
        for future in list(self._futures.values()):
            future.cancel()
        self._futures.clear()
        self._submitted_at.clear()

    # ---- called from any thread ---------------------------------------------------------
    def submit(self, requests: list[Request]) -> list[Future]:
        futures = []
        for request in requests:
            future: Future = Future()
            self._count_queued(request.num_tokens)
            # Done in every way (result, failure, abort): its tokens leave the queue.
            future.add_done_callback(
                lambda _, n=request.num_tokens: self._count_queued(-n))
            self._inbox.put(("add", request, future))
            futures.append(future)
        self._wakeup.set()
        return futures

    def run_to_completion(self, requests: list[Request], progress,
                          cancel: threading.Event | None) -> dict[str, RequestOutput]:
        """Submit `requests` and wait until all finish, ticking `progress` (tqdm-like) as
        they do; setting `cancel` aborts the unfinished ones and raises RequestCancelled."""
        futures = dict(zip((r.request_id for r in requests), self.submit(requests)))
        pending = set(futures.values())
        while pending:
            done, pending = wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)
            progress.update(len(done))
            if cancel is not None and cancel.is_set() and pending:
                self.abort([rid for rid, f in futures.items() if not f.done()])
                raise RequestCancelled(f"{len(pending)} of {len(futures)} requests aborted")
        results = {}
        for req_id, future in futures.items():
            if future.cancelled():
                raise RequestCancelled(f"request {req_id} was aborted")
            results[req_id] = future.result()  # re-raises a submission error
        return results

    def _count_queued(self, delta: int) -> None:
        with self._queued_lock:
            self._queued_tokens += delta

    def abort(self, request_ids: list[str]) -> None:
        self._inbox.put(("abort", list(request_ids), None))
        self._wakeup.set()

    def call_soon(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the loop thread between steps, after everything submitted before it
        (e.g. release state once an abort has taken effect). The future holds its result."""
        future: Future = Future()
        self._inbox.put(("call", fn, future))
        self._wakeup.set()
        return future

    # ---- the loop thread ----------------------------------------------------------------
    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload, future = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.core.add_request(payload)
                except Exception as exc:  # e.g. a duplicate id: fail this request only
                    future.set_exception(exc)
                else:
                    self._futures[payload.request_id] = future
                    self._submitted_at[payload.request_id] = payload.arrival_time
            elif kind == "call":
                try:
                    future.set_result(payload())
                except Exception as exc:  # a callback's bug must not stop the loop
                    logger.exception("engine loop callback failed")
                    future.set_exception(exc)
            else:
                for req_id in self.core.abort_requests(payload):
                    self._submitted_at.pop(req_id, None)
                    future = self._futures.pop(req_id, None)
                    if future is not None:
                        future.cancel()

    def _run(self) -> None:
        busy = False
        while not self._stopping:
            self._drain_inbox()
            if not self.core.has_work():
                if busy:  # just went idle: e.g. hand the burst's freed heap back to the OS
                    busy = False
                    self._notify_idle()
                self._wakeup.wait(timeout=0.5)
                self._wakeup.clear()
                continue
            busy = True
            start = time.perf_counter()
            started_at = time.monotonic()  # the clock of Request.arrival_time
            try:
                outputs = self.core.step()
            except Exception:  # a bug, not bad input: keep serving, fail what was running
                logger.exception("engine step failed")
                self._fail_running("internal error in the engine step")
                continue
            elapsed = time.perf_counter() - start
            finished_at = time.monotonic()
            if outputs:
                tokens = sum(o.num_tokens for o in outputs)
                self._recent_steps.append((tokens, elapsed))
                for listener in self.step_listeners:
                    listener(len(outputs), tokens, elapsed)
            for output in outputs:
                submitted = self._submitted_at.pop(output.request_id, None)
                if submitted is not None:
                    for listener in self.queue_listeners:
                        listener(max(0.0, started_at - submitted))
                    output.timing = RequestTiming(submitted, started_at, finished_at)
                    for listener in self.finish_listeners:
                        listener(output)
                self._resolve(output)

    def _notify_idle(self) -> None:
        for listener in self.idle_listeners:
            try:
                listener()
            except Exception:
                logger.exception("engine idle listener failed")

    def _resolve(self, output: RequestOutput) -> None:
        future = self._futures.pop(output.request_id, None)
        if future is not None and not future.done():
            future.set_result(output)

    def _fail_running(self, message: str) -> None:
        for request in list(self.core.scheduler.running):
            self.core.scheduler.running.remove(request)
            self.core.scheduler._finish(request)
            self._submitted_at.pop(request.request_id, None)
            future = self._futures.pop(request.request_id, None)
            if future is not None:
                future.set_exception(RuntimeError(message))
