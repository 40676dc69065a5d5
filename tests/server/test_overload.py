"""Bounded latency under overload: the queue is measured in tokens, its default limit follows
the engine's measured rate, an overload gets fast 503s with Retry-After (never a time-out),
/health stays answered and memory returns near its level before the burst."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pooler.server.edges.limits import TokenAdmission
from pooler.server.errors import APIError
from pooler.server.settings import ServerSettings


def test_token_limit_rule():
    rate = [None]
    adm = TokenAdmission(step_budget=2048, rate=lambda: rate[0], max_queue_seconds=5.0)
    assert adm.limit() == 2048 * 5  # before any measured step: a step budget per second
    rate[0] = 3000.0
    assert adm.limit() == 15000                                  # tokens/s x seconds
    rate[0] = 100.0
    assert adm.limit() == 2048                                   # never below one step
    assert TokenAdmission(2048, lambda: 3000.0, 5.0, max_queue_tokens=700).limit() == 700


def test_reserve_refuses_over_the_limit_but_never_an_empty_queue():
    adm = TokenAdmission(step_budget=100, rate=lambda: 50.0, max_queue_seconds=2.0)
    assert adm.reserve(5000) == 5000         # nothing in flight: always admitted
    with pytest.raises(APIError) as refused:
        adm.reserve(1)
    assert refused.value.status == 503 and refused.value.code == "queue_full"
    assert refused.value.headers["retry-after"] == "60"  # 5000 tokens at 50/s, capped
    adm.release(5000)
    # An estimate is replaced by the exact count; a refusal drops the estimate too.
    est = adm.reserve(80)
    adm.reserve(60, replacing=est)
    assert adm.in_flight == 60
    est = adm.reserve_estimate(4 * 30)        # 30 tokens guessed from 120 body bytes
    assert adm.in_flight == 90
    with pytest.raises(APIError):
        adm.reserve(500, replacing=est)
    assert adm.in_flight == 60
    assert adm.would_refuse(4 * 200) is not None and adm.would_refuse(4 * 10) is None


def test_small_request_floor():
    """Small requests pass a full queue while at most `slots` requests are in flight; large
    ones, and small ones past the slots, meet the time bound."""
    adm = TokenAdmission(step_budget=100, rate=lambda: 10.0, max_queue_seconds=10.0,
                         small_request_slots=2, small_request_tokens=300)
    adm.reserve(90)                                     # the queue is nearly full (limit 100)
    adm.open_request()
    assert adm.reserve(250, request_tokens=250) == 250  # small: past the bound
    with pytest.raises(APIError):
        adm.reserve(400, request_tokens=400)            # more tokens than a small request
    with pytest.raises(APIError):
        adm.reserve(50)                                 # not small by its inputs
    adm.open_request()
    adm.open_request()                                  # 3 requests in flight, 2 slots
    with pytest.raises(APIError):
        adm.reserve(10, request_tokens=10)
    assert adm.would_refuse(4 * 50) is not None
    adm.close_request()
    assert adm.would_refuse(4 * 50) is None             # the handler decides, exactly
    assert adm.reserve_estimate(4 * 50, small=True) == 50  # a guess is not refused then
    with pytest.raises(APIError):
        adm.reserve_estimate(4 * 50)


def test_full_queue_gives_fast_503_with_retry_after(engine, serve_app):
    settings = ServerSettings(max_queue_tokens=50, small_request_slots=0)
    with serve_app(engine, settings) as (url, app), httpx.Client(base_url=url) as c:
        admission = app.state.pooler.token_admission
        admission.in_flight += 40  # as if other clients had 40 tokens queued
        try:
            for body in ({"input": ["word " * 30]}, {"input": "x " * 5000}):
                r = c.post("/v1/embeddings", json=body)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == 503  # vLLM's shape on a vLLM route
                assert "--max-queue-tokens" in r.json()["error"]["message"]
                assert int(r.headers["retry-after"]) >= 1
            assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 200
            assert c.get("/health").status_code == 200
        finally:
            admission.in_flight -= 40
        assert admission.in_flight == 0


def test_scaled_down_burst(engine, serve_app):
    """40 clients x 64 texts at once (the full 200 x 64 figures are in docs/dev/journal.md):
    every client gets a 200 or a 503 with Retry-After, none times out; /health keeps
    answering; the queue holds about max_queue_seconds of work."""
    from pooler.bench.burst import burst
    from pooler.bench.machine import rss_mb

    settings = ServerSettings(max_queue_seconds=1.0)
    with serve_app(engine, settings) as (url, app):
        httpx.post(f"{url}/v1/embeddings", json={"input": ["warm up"] * 64}, timeout=120)
        before = rss_mb()
        result = asyncio.run(burst(url, clients=40, num_texts=64, timeout=120))
        summary = result.summary()
        assert summary["other"] == 0, summary               # no time-outs, no other status
        assert summary["answered"] >= 1 and summary["refused"] >= 1, summary
        assert summary["refusals_with_retry_after"] == summary["refused"]
        assert result.health_failures == 0 and result.health_ms
        assert summary["max_s"] < 90, summary
        assert app.state.pooler.token_admission.in_flight == 0
        assert engine.num_queued_tokens == 0
        assert rss_mb() < before * 1.15 + 50, (before, rss_mb())
