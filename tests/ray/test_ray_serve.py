"""Ray Serve on a two-node cluster: the `pooler serve` app with one Engine per replica. Answers
equal the offline Engine's (1e-5), ColBERT rerank runs whole on one replica, and killing a
replica under load gives errors or answers (never a hang) while Serve replaces it."""
from __future__ import annotations

import socket
import time

import httpx
import numpy as np
import pytest
import ray
from ray import serve

from pooler.engine.llm import Engine
from pooler.ray.serve import REPLICA_HEADER, serve_app
from tests.batch.conftest import corpus_texts
from tests.ray.load_under_kill import assert_only_in_flight_lost, load_through_kill

# Serve's proxy answers 408 after this: bounds a request lost in a replica's death (see
# assert_only_in_flight_lost) without holding the test for long.
REQUEST_TIMEOUT_S = 15


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def serve_url(ray_cluster):
    port = free_port()
    # One proxy (two nodes on one machine cannot both bind the port).
    serve.start(http_options={"host": "127.0.0.1", "port": port,
                              "request_timeout_s": REQUEST_TIMEOUT_S},
                proxy_location="HeadOnly")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


@pytest.fixture(scope="module")
def embed_app(serve_url, tiny_embedder):
    serve.run(serve_app(str(tiny_embedder), replicas=2, num_cpus=1), name="embed",
              route_prefix="/")
    yield serve_url
    serve.delete("embed")


def embeddings(client: httpx.Client, texts: list[str]) -> tuple[np.ndarray, str]:
    r = client.post("/v1/embeddings", json={"input": texts})
    r.raise_for_status()
    return np.array([d["embedding"] for d in r.json()["data"]]), r.headers[REPLICA_HEADER]


def test_routes_match_engine_on_both_replicas(embed_app, tiny_embedder):
    engine = Engine(str(tiny_embedder))
    texts = corpus_texts(7, seed=21)
    want = np.stack([o.embedding for o in engine.embed(texts)])
    replicas = set()
    with httpx.Client(base_url=embed_app, timeout=60) as client:
        assert client.get("/health").status_code == 200
        for _ in range(24):
            got, replica = embeddings(client, texts)
            np.testing.assert_allclose(got, want, atol=1e-5)
            replicas.add(replica)
        single, _ = embeddings(client, [texts[0]])
        np.testing.assert_allclose(single[0], want[0], atol=1e-5)
        bad = client.post("/v1/embeddings", json={"input": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and "pooler_http_requests" in metrics.text
    assert len(replicas) == 2  # both replicas answered, each with its own engine


def test_colbert_rerank_runs_on_one_replica(serve_url, tmp_path):
    from tests.models.colbert_folders import build_tiny_stanford

    folder = build_tiny_stanford(tmp_path / "colbert")
    serve.run(serve_app(str(folder), replicas=1, num_cpus=1), name="colbert",
              route_prefix="/colbert")
    try:
        engine = Engine(str(folder))
        docs = corpus_texts(6, seed=22)
        want = engine.rerank("where is the fox", docs)
        with httpx.Client(base_url=f"{serve_url}/colbert", timeout=60) as client:
            r = client.post("/rerank", json={"query": "where is the fox", "documents": docs})
        assert r.status_code == 200, r.text
        got = r.json()["results"]
        assert [x["index"] for x in got] == [w.index for w in want]
        np.testing.assert_allclose([x["relevance_score"] for x in got],
                                   [w.score for w in want], atol=1e-5)
    finally:
        serve.delete("colbert")


def _replica_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::embed#")]


def test_killed_replica_under_load(embed_app, tiny_embedder):
    engine = Engine(str(tiny_embedder))
    texts = corpus_texts(32, seed=23)
    want = np.stack([o.embedding for o in engine.embed(texts)])
    names = _replica_actors()
    assert len(names) == 2
    before, results = load_through_kill(
        embed_app, texts, want,
        kill=lambda: ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True))
    outcomes = [o for _, o in results]
    assert before > 0 and outcomes.count("ok") > before  # the other replica kept serving
    assert_only_in_flight_lost(results, clients=4, request_timeout_s=REQUEST_TIMEOUT_S)
    # Serve replaces the dead replica.
    deadline = time.monotonic() + 120
    while True:
        alive = _replica_actors()
        status = serve.status().applications["embed"].deployments["pooler"]
        if len(alive) == 2 and names[0] not in alive and \
                status.replica_states.get("RUNNING", 0) == 2:
            break
        assert time.monotonic() < deadline, f"replica not replaced: {alive}, {status}"
        time.sleep(1)
    with httpx.Client(base_url=embed_app, timeout=60) as client:
        got, _ = embeddings(client, texts)
    np.testing.assert_allclose(got, want, atol=1e-5)
    print("outcomes:", {o: outcomes.count(o) for o in set(outcomes)})
