"""Several models behind one server: routing by `model`, by route task when no model is named,
aggregated /v1/models, /info, /health and /metrics, and one model's stall not reaching the
others (separate engines and queues)."""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from tests.models.tiny import add_st_pooling, save_tiny_bert


@pytest.fixture(scope="module")
def engines(tmp_path_factory, minilm_path, tiny_model):
    from pooler import Engine

    root = tmp_path_factory.mktemp("multi")
    embedder = save_tiny_bert(root / "emb", minilm_path, seed=1)
    add_st_pooling(embedder, "mean", normalize=True)
    reranker = tiny_model(root / "ce", minilm_path, "BertForSequenceClassification", 1)
    return {"emb": Engine(str(embedder)), "ce": Engine(str(reranker))}


@pytest.fixture(scope="module")
def multi(engines):
    import uvicorn

    from pooler.server.app import create_app
    from pooler.server.multi_model import ModelRouter, ServedModel
    from pooler.server.settings import ServerSettings
    from tests.server.conftest import free_port
    from tests.server.health import wait_until_healthy

    served = [ServedModel(name, create_app(engine, ServerSettings(served_model_name=name)),
                          memory_mb=1.0)
              for name, engine in engines.items()]
    router = ModelRouter(served)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(router, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url, 60, thread.is_alive)
    yield url
    server.should_exit = True
    thread.join(30)


def test_requests_go_to_the_named_model(multi, engines):
    with httpx.Client(base_url=multi, timeout=60) as client:
        r = client.post("/v1/embeddings", json={"model": "emb", "input": ["a b c", "d"]})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        want = np.stack([o.embedding for o in engines["emb"].embed(["a b c", "d"])])
        np.testing.assert_allclose(got, want, atol=1e-5)
        r = client.post("/v1/rerank", json={"model": "ce", "query": "q",
                                            "documents": ["x", "y z"]})
        assert r.status_code == 200, r.text
        want = engines["ce"].rerank("q", ["x", "y z"])
        assert [x["index"] for x in r.json()["results"]] == [w.index for w in want]
        r = client.post("/v1/embeddings", json={"model": "nope", "input": "a"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_unnamed_requests_go_to_the_model_serving_the_route(multi, engines):
    with httpx.Client(base_url=multi, timeout=60) as client:
        r = client.post("/rerank", json={"query": "q", "texts": ["x", "y z"]})  # TEI shape
        assert r.status_code == 200, r.text
        scores = {x["index"]: x["score"] for x in r.json()}
        ref = engines["ce"].score("q", ["x", "y z"])
        assert abs(scores[1] - ref[1].score) < 1e-5
        r = client.post("/embed", json={"inputs": "a b c"})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()[0], engines["emb"].embed("a b c")[0].embedding,
                                   atol=1e-5)


def test_every_model_is_listed_and_labelled(multi):
    with httpx.Client(base_url=multi, timeout=60) as client:
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert ids == ["emb", "ce"]
        info = client.get("/info").json()
        assert [m["model_id"] for m in info["models"]] == ["emb", "ce"]
        assert all(m["memory_mb"] == 1.0 for m in info["models"])
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["models"] == {"emb": "ok",
                                                                          "ce": "ok"}
        metrics = client.get("/metrics").text
        assert 'model="emb"' in metrics and 'model="ce"' in metrics


def test_a_stalled_model_does_not_stall_the_others(multi, engines):
    release = threading.Event()
    core = engines["emb"].core
    real_step = core.step

    def stalled_step():
        release.wait(30)
        return real_step()
    core.step = stalled_step
    try:
        results = {}

        def call_embedder():
            with httpx.Client(base_url=multi, timeout=60) as c:
                results["emb"] = c.post("/v1/embeddings", json={"model": "emb", "input": "x"})
        waiter = threading.Thread(target=call_embedder)
        waiter.start()
        time.sleep(0.5)
        started = time.monotonic()
        with httpx.Client(base_url=multi, timeout=60) as client:
            r = client.post("/v1/rerank", json={"model": "ce", "query": "q",
                                                "documents": ["x"]})
        elapsed = time.monotonic() - started
        assert r.status_code == 200 and elapsed < 10  # answered while emb is stalled
        assert "emb" not in results
    finally:
        release.set()
        core.step = real_step
    waiter.join(30)
    assert results["emb"].status_code == 200


def test_names_must_be_unique(engines):
    from pooler.server.app import create_app
    from pooler.server.multi_model import ModelRouter, ServedModel
    from pooler.server.settings import ServerSettings

    apps = [ServedModel("same", create_app(e, ServerSettings(served_model_name="same"),
                                           owns_engine=False)) for e in engines.values()]
    with pytest.raises(ValueError, match="unique"):
        ModelRouter(apps)
