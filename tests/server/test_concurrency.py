"""Many concurrent clients share engine batches; a client that leaves leaves no queued work."""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import numpy as np


def _texts(client_id: int, n: int) -> list[list[str]]:
    words = "cat dog river mountain search engine vector query token model paris tokyo".split()
    return [[f"client {client_id} request {i} " + " ".join(words[(client_id + i + k) % len(words)]
                                                         for k in range(1 + (i % 5)))
             for _ in range(1 + (i % 3))] for i in range(n)]


def test_32_clients_x_20_requests_mixed_routes(url, engine):
    num_clients, per_client = 32, 20
    plan = {c: _texts(c, per_client) for c in range(num_clients)}
    all_texts = sorted({t for reqs in plan.values() for texts in reqs for t in texts})
    expected = dict(zip(all_texts, (e.embedding for e in engine.embed(all_texts))))

    def text_count(metrics: str) -> tuple[float, float]:
        count = float(re.search(r"^pooler_batch_requests_count (\S+)$", metrics, re.M)[1])
        ones = float(re.search(r'^pooler_batch_requests_bucket\{le="1.0"\} (\S+)$', metrics,
                               re.M)[1])
        return count, ones

    async def one_client(c: int, http: httpx.AsyncClient) -> int:
        checked = 0
        for i, texts in enumerate(plan[c]):
            route = i % 4
            if route == 0:
                r = await http.post("/v1/embeddings", json={"input": texts})
                vectors = [d["embedding"] for d in r.json()["data"]]
            elif route == 1:
                r = await http.post("/embed", json={"inputs": texts})
                vectors = r.json()
            elif route == 2:
                r = await http.post("/pooling", json={"input": texts, "task": "embed"})
                vectors = [d["data"] for d in r.json()["data"]]
            else:
                r = await http.post("/tokenize", json={"prompt": texts[0]})
                assert r.status_code == 200
                assert r.json()["tokens"] == engine.tokenizer.encode_batch(texts[:1])[0].input_ids
                checked += 1
                continue
            assert r.status_code == 200, r.text
            for text, vec in zip(texts, vectors, strict=True):
                # Batches differ from the offline call's, so allow float reordering noise.
                np.testing.assert_allclose(np.array(vec, np.float32), expected[text], atol=2e-5)
                checked += 1
        return checked

    async def main():
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            before = text_count((await http.get("/metrics")).text)
            counts = await asyncio.gather(*(one_client(c, http) for c in range(num_clients)))
            after = text_count((await http.get("/metrics")).text)
        return counts, before, after

    counts, before, after = asyncio.run(main())
    assert all(n > 0 for n in counts) and len(counts) == num_clients
    steps = after[0] - before[0]
    single_request_steps = after[1] - before[1]
    assert steps > 0
    # Continuous batching: some engine steps carried requests from more than one input.
    assert single_request_steps < steps, (steps, single_request_steps)


def test_client_disconnect_aborts_queued_work(url, engine):
    loop = engine._loop
    computed = []
    listener = lambda n, tokens, seconds: computed.append(n)  # noqa: E731
    loop.step_listeners.append(listener)
    texts = [f"disconnecting client text number {i} with some more words in it" for i in range(3000)]
    try:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=0.7)) as c:
            try:
                c.post("/v1/embeddings", json={"input": texts})
                raise AssertionError("expected the client to time out and hang up")
            except httpx.ReadTimeout:
                pass
        deadline = time.monotonic() + 30
        while (loop.num_unfinished or engine.core.scheduler.num_waiting
               or engine.core.has_unfinished_requests()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loop.num_unfinished == 0
        assert engine.core.scheduler.num_waiting == 0
        assert not engine.core.has_unfinished_requests()
        assert sum(computed) < len(texts), "everything was computed: nothing was aborted"
    finally:
        loop.step_listeners.remove(listener)
    # The server still answers, and counted the aborted request as 499.
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/embeddings", json={"input": "still alive"}).status_code == 200
        deadline = time.monotonic() + 10
        while '/v1/embeddings",status="499"' not in c.get("/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.1)
