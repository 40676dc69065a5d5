"""Admission (issue 28, part 3): one refusal shape per protocol with Retry-After on every
refusal, tokenizer-only routes outside the model queue, and a steady closed-loop load answered
in full with the default rule. The full-size loads (64 clients x 8 texts, 200 x 64 bursts) are
`python -m pooler.bench.burst`, figures in docs/operating/admission.md."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from pooler.server.settings import ServerSettings

LIMIT = 50


@pytest.fixture(scope="module")
def full(engine, serve_app):
    """A server whose token queue is full: every model request is refused."""
    settings = ServerSettings(max_queue_tokens=LIMIT, small_request_slots=0)
    with serve_app(engine, settings) as (url, app):
        admission = app.state.pooler.token_admission
        admission.in_flight += LIMIT  # as if other clients held the whole queue
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                yield c, app
        finally:
            admission.in_flight -= LIMIT


def _retry_after(r: httpx.Response) -> int:
    assert "retry-after" in r.headers, (r.status_code, r.text)
    return int(r.headers["retry-after"])


BIG = ["a sentence of several words for the queue " * 8] * 4


@pytest.mark.parametrize("body_texts", [["a"], BIG], ids=["small", "large"])
@pytest.mark.parametrize("route,field", [("/v1/embeddings", "input"), ("/pooling", "input")])
def test_vllm_routes_refuse_in_vllm_shape(full, route, field, body_texts):
    c, _ = full
    r = c.post(route, json={field: body_texts})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
    assert "--max-queue-tokens" in error["message"]
    assert _retry_after(r) >= 1


@pytest.mark.parametrize("route,body", [
    ("/embed", {"inputs": BIG}), ("/embed", {"inputs": "a"}),  # handler / early refusal
    ("/embed_all", {"inputs": BIG}), ("/embeddings", {"input": BIG}),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": BIG}}),
    ("/", {"inputs": BIG})])
def test_tei_routes_refuse_with_429_overloaded(full, route, body):
    c, _ = full
    r = c.post(route, json=body)
    assert r.status_code == 429, r.text
    assert set(r.json()) == {"error", "error_type"} and r.json()["error_type"] == "Overloaded"
    assert _retry_after(r) >= 1


@pytest.mark.parametrize("route,body", [("/v2/embed", {"texts": BIG, "model": "x"}),
                                        ("/embed", {"texts": BIG})])  # Cohere v1 on /embed
def test_cohere_routes_refuse_in_cohere_shape(full, route, body):
    c, _ = full
    r = c.post(route, json=body)
    assert r.status_code == 503, r.text
    assert set(r.json()) == {"message"} and "busy" in r.json()["message"]
    assert _retry_after(r) >= 1


def test_pooler_routes_refuse_in_openai_shape(full):
    c, _ = full
    r = c.post("/embed_chunks", json={"document": "One sentence. Another one."})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "queue_full"
    assert _retry_after(r) >= 1


def test_tokenizer_routes_never_wait_in_the_model_queue(full):
    c, app = full
    state = app.state.pooler
    before = (state.token_admission.in_flight, state.admission.in_flight)
    r = c.post("/tokenize", json={"prompt": "hello world " * 50})
    assert r.status_code == 200 and r.json()["count"] > 100
    r = c.post("/tokenize", json={"inputs": ["hello world"] * 8})
    assert r.status_code == 200 and len(r.json()) == 8
    ids = c.post("/tokenize", json={"prompt": "hello world"}).json()["tokens"]
    assert c.post("/detokenize", json={"tokens": ids}).status_code == 200
    assert c.post("/decode", json={"ids": ids}).json() == ["hello world"]
    for path in ("/info", "/v1/models", "/health"):
        assert c.get(path).status_code == 200
    assert (state.token_admission.in_flight, state.admission.in_flight) == before


def test_shutdown_refusal_on_a_tei_route_is_unhealthy_with_retry_after():
    from pooler.server.dialects.tei import as_tei_error
    from pooler.server.edges.shutdown import ShutdownGate

    error = as_tei_error(ShutdownGate.refusal())
    response = error.response()
    assert response.status_code == 503 and error.error_type == "Unhealthy"
    assert response.headers["retry-after"]


def test_steady_closed_loop_load_is_answered_in_full(engine, serve_app):
    """16 closed-loop clients x 4 requests of 1-8 texts (one in eight past the model's
    length), all answered, even with a token limit far below what they hold (the floor);
    64 clients: the bench."""
    from pooler.bench.burst import steady

    settings = ServerSettings(max_queue_tokens=1000)
    with serve_app(engine, settings) as (url, app):
        result = asyncio.run(steady(url, clients=16, requests=4, max_texts=8, timeout=120))
        summary = result.summary()
        assert summary["statuses"] == {"200": 64}, summary
        admission = app.state.pooler.token_admission
        assert admission.in_flight == 0 and admission.requests == 0



def test_floor_keeps_refusing_large_requests(engine, serve_app):
    """A request of more than --small-request-inputs inputs meets the token limit even while
    the floor has room."""
    settings = ServerSettings(max_queue_tokens=LIMIT)
    with serve_app(engine, settings) as (url, app):
        admission = app.state.pooler.token_admission
        admission.in_flight += LIMIT
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                r = c.post("/v1/embeddings", json={"input": ["a few words"] * 9})
                assert r.status_code == 503, r.text
                r = c.post("/v1/embeddings", json={"input": ["a few words"] * 8})
                assert r.status_code == 200, r.text
        finally:
            admission.in_flight -= LIMIT
        assert admission.in_flight == 0 and admission.requests == 0
