"""EngineLoop.shutdown never leaves a caller waiting forever (issue 18, item 1): requests the
loop will never finish are cancelled when it stops, so their waiters raise RequestCancelled
instead of blocking (the server's worker threads, then the process exit)."""
from __future__ import annotations

import time

from pooler.engine.engine_loop import EngineLoop


class _NeverFinishingCore:
    """Accepts requests and steps forever without finishing any (a model far too slow)."""

    def __init__(self):
        self.requests = {}

    def add_request(self, request):
        self.requests[request.request_id] = request

    def abort_requests(self, ids):
        return [i for i in ids if self.requests.pop(i, None) is not None]

    def has_work(self):
        return bool(self.requests)

    def step(self):
        time.sleep(0.02)
        return []


class _Req:
    def __init__(self, rid):
        self.request_id = rid
        self.arrival_time = time.monotonic()
        self.num_tokens = 1


def test_shutdown_cancels_what_never_finished():
    loop = EngineLoop(_NeverFinishingCore())
    loop.start()
    futures = loop.submit([_Req("a"), _Req("b")])
    started = time.monotonic()
    loop.shutdown(timeout=0.3)
    assert time.monotonic() - started < 2.0
    assert not loop.is_running
    assert all(f.cancelled() for f in futures)
    assert loop.num_unfinished == 0


def test_requests_submitted_after_the_loop_stopped_are_cancelled_too():
    loop = EngineLoop(_NeverFinishingCore())
    loop.start()
    loop.shutdown(timeout=0.1)
    late = loop.submit([_Req("late")])
    loop._cancel_unfinished()  # what shutdown does with whatever is left in the inbox
    assert late[0].cancelled()
