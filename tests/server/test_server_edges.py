"""Issue 18, items 4-7: TEI /rerank with truncation_direction, a client that leaves mid-body
is a 499 in /metrics, the engine-queue and late-interaction gauges, and a model name (not a
path) in /info and /v1/models unless the operator asks."""
from __future__ import annotations

import asyncio
import random
import re
import time

import httpx
import pytest

from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.config import SchedulerConfig
from pooler.engine.request import Request
from pooler.engine.scheduler import Scheduler
from pooler.params import LateInteractionParams, PoolingParams
from pooler.server.observability.metrics import ServerMetrics
from pooler.server.settings import ServerSettings
from tests.models.colbert_folders import build_tiny_stanford

LONG = "the beginning of this text " + "filler words " * 300 + "and its very end"


# ---- 4: TEI /rerank with truncation_direction -------------------------------------------------
@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_server):
    return cross_encoder_server[:2]


@pytest.mark.parametrize("direction", ["Left", "Right", "left", "right"])
def test_tei_rerank_takes_truncation_direction(cross_encoder, client, engine, direction):
    body = {"query": "the beginning", "texts": [LONG, "short"], "truncate": True,
            "truncation_direction": direction}
    url, ce_engine = cross_encoder
    r = httpx.post(f"{url}/rerank", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()) == [0, 1]
    # TEI reranks with cross-encoders only: on the bi-encoder the option is no 500 either,
    # but TEI's 424 (the model is of another type).
    assert client.post("/rerank", json=body).status_code == 424
    # The direction really reaches the tokenizer: the served score of the long text is the
    # offline engine's for that direction, and left differs from right.
    served = {x["index"]: x["score"] for x in r.json()}[0]
    offline = ce_engine.score("the beginning", [LONG], truncation_direction=direction.lower())
    assert served == pytest.approx(offline[0].score, abs=1e-5)
    # The tiny random cross-encoder barely tells the two ends apart; MiniLM (bi-encoder
    # scoring, same option path) shows that the direction changes what is scored.
    flipped = "left" if direction.lower() == "right" else "right"
    ours = engine.score("the beginning", [LONG], truncation_direction=direction.lower())
    other = engine.score("the beginning", [LONG], truncation_direction=flipped)
    assert abs(ours[0].score - other[0].score) > 1e-3


# ---- 5: a client that leaves mid-body is 499, never 5xx --------------------------------------
def _metric(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return None


def test_client_leaving_mid_body_is_a_499(engine, serve_app):
    with serve_app(engine) as (url, app):
        port = int(url.rsplit(":", 1)[1])

        async def leave_mid_body():
            for _ in range(5):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n"
                             b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                             b'{"input": "')
                await writer.drain()
                await asyncio.sleep(0.1)
                writer.close()

        asyncio.run(leave_mid_body())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = httpx.get(f"{url}/metrics").text
            if _metric(text, "pooler_http_requests_total", route="/v1/embeddings",
                       status="499") == 5:
                break
            time.sleep(0.05)
        assert _metric(text, "pooler_http_requests_total", method="POST",
                       route="/v1/embeddings", status="499") == 5, text
        assert not re.search(r'pooler_http_requests_total\{[^}]*status="5', text), text


# ---- 6: engine queue and late-interaction gauges ---------------------------------------------
def test_queue_stats_count_waiting_and_running_requests_and_tokens():
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=8))
    for i, n in enumerate([30, 40, 50]):
        scheduler.add_request(Request(f"r{i}", list(range(n)), PoolingParams(task="embed")))
    stats = scheduler.queue_stats()
    assert (stats.waiting, stats.waiting_tokens, stats.running, stats.running_tokens) == \
        (3, 120, 0, 0)
    scheduler.schedule()  # 30 + 40 fit the 100-token budget
    stats = scheduler.queue_stats()
    assert (stats.waiting, stats.waiting_tokens, stats.running, stats.running_tokens) == \
        (1, 50, 2, 70)
    scheduler.abort_requests(["r2"])
    assert scheduler.queue_stats().waiting == 0


@pytest.fixture(scope="module")
def colbert_engine(tmp_path_factory):
    from pooler import Engine

    engine = Engine(str(build_tiny_stanford(tmp_path_factory.mktemp("colbert-gauges") / "m")),
                    device="cpu")
    yield engine
    engine.shutdown(timeout=5)


def _colbert_request(engine, text, role, li):
    [item] = engine.colbert_inputs.build([text], role)
    params = engine.verify_params(PoolingParams(task="token_embed", late_interaction=li, extra={
        ROLE_KEY: role, UNATTENDED_KEY: item.extra[UNATTENDED_KEY]}))
    return Request(f"{role}-{random.random()}", item.prompt_token_ids, params)


def test_late_interaction_and_queue_gauges(colbert_engine):
    engine, metrics = colbert_engine, ServerMetrics()

    def gauge(name):
        return metrics.registry.get_sample_value(name)

    query_tokens = engine.encode_queries(["what is alpha"])[0].embeddings.shape  # [len, dim]
    core = engine.core
    core.add_request(_colbert_request(engine, "what is alpha", "query",
                                      LateInteractionParams("cache_query", "k", 2)))
    while core.has_work():
        core.step()
    doc = _colbert_request(engine, "alpha beta gamma", "document",
                           LateInteractionParams("score_doc", "k"))
    core.add_request(doc)
    metrics.observe_engine(engine)
    assert gauge("pooler_late_interaction_cached_queries") == 1
    assert gauge("pooler_late_interaction_cached_bytes") == \
        query_tokens[0] * query_tokens[1] * 4  # float32
    assert gauge("pooler_engine_requests_waiting") == 1
    assert gauge("pooler_engine_tokens_waiting") == len(doc.prompt_token_ids)
    assert gauge("pooler_engine_requests_running") == 0
    while core.has_work():  # the doc is scored: one use of two left, the query stays
        core.step()
    metrics.observe_engine(engine)
    assert gauge("pooler_late_interaction_cached_queries") == 1
    assert gauge("pooler_late_interaction_pending_docs") == 0
    assert gauge("pooler_engine_requests_waiting") == 0
    engine.drop_cached_queries(["k"])
    metrics.observe_engine(engine)
    assert gauge("pooler_late_interaction_cached_queries") == 0
    assert gauge("pooler_late_interaction_cached_bytes") == 0


def test_metrics_route_exposes_the_gauges(client):
    text = client.get("/metrics").text
    for name in ("pooler_engine_requests_waiting", "pooler_engine_requests_running",
                 "pooler_engine_tokens_waiting", "pooler_engine_tokens_running",
                 "pooler_late_interaction_cached_queries",
                 "pooler_late_interaction_pending_docs", "pooler_late_interaction_cached_bytes",
                 "pooler_http_connections_open", "pooler_server_draining"):
        assert _metric(text, name) is not None, name


# ---- 7: a model name, not a path -------------------------------------------------------------
def test_model_name_not_path_unless_asked(engine, minilm_path, serve_app):
    folder = str(engine.model_config.path)
    with serve_app(engine) as (url, app):
        info = httpx.get(f"{url}/info").json()
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        embedded = httpx.post(f"{url}/v1/embeddings", json={"input": "x"}).json()
    name = minilm_path.resolve().name
    for shown in (info["model_id"], card["id"], card["root"], embedded["model"]):
        assert shown == name
        assert "/" not in shown
    assert info["model_path"] is None
    with serve_app(engine, ServerSettings(show_model_path=True)) as (url, app):
        assert httpx.get(f"{url}/info").json()["model_path"] == folder
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["root"] == folder
        # Clients may still name the model by its path.
        r = httpx.post(f"{url}/v1/embeddings", json={"input": "x", "model": folder})
        assert r.status_code == 200


def test_display_name_keeps_hub_names():
    from pooler.server.state import display_name

    assert display_name("sentence-transformers/all-MiniLM-L6-v2") == \
        "sentence-transformers/all-MiniLM-L6-v2"
    assert display_name("/srv/models/bge-small/") == "bge-small"
    assert display_name("./models/e5") == "e5"


def test_a_handler_cancelled_at_shutdown_answers_503_not_500():
    """uvicorn's backstop (graceful timeout + 5 s) cancels handlers that are still running:
    the client gets 503 with Retry-After, not uvicorn's bare 500."""
    from pooler.server.edges.connection_limits import BodyTimeoutMiddleware
    from pooler.server.edges.shutdown import ShutdownGate

    async def stuck_app(scope, receive, send):
        await asyncio.sleep(3600)

    async def main():
        gate = ShutdownGate()
        sent = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        guard = BodyTimeoutMiddleware(stuck_app, timeout=60, gate=gate)
        task = asyncio.ensure_future(guard({"type": "http", "method": "GET", "path": "/x"},
                                           receive, send))
        await asyncio.sleep(0.05)
        gate.begin()
        task.cancel()
        await asyncio.wait({task}, timeout=5)
        return sent

    sent = asyncio.run(main())
    start = sent[0]
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
