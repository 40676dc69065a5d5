"""TEI's and vLLM's metric names on /metrics (and --prometheus-port) beside pooler's own: a live
server is scraped after requests of each kind; every name has its type and labels, and the
counts add up across the families."""
from __future__ import annotations

import re
from collections import defaultdict

import httpx
import pytest

from pooler.server.settings import ServerSettings

TEI_TYPES = {
    "te_request_count": "counter", "te_request_success": "counter",
    "te_request_failure": "counter", "te_embed_count": "counter",
    "te_embed_success": "counter", "te_predict_count": "counter",
    "te_predict_success": "counter", "te_request_duration": "histogram",
    "te_request_tokenization_duration": "histogram", "te_request_queue_duration": "histogram",
    "te_request_inference_duration": "histogram", "te_request_input_length": "histogram",
    "te_batch_next_size": "histogram", "te_batch_next_tokens": "histogram",
    "te_queue_size": "gauge"}
VLLM_TYPES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:prompt_tokens_total": "counter", "vllm:request_success_total": "counter",
    "vllm:request_prompt_tokens": "histogram"}

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


class Scrape:
    """Prometheus text format, parsed: TYPE per family and every sample's value."""

    def __init__(self, text: str):
        self.types: dict[str, str] = {}
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ")
                self.types[name] = kind
            elif line and not line.startswith("#"):
                name, labels, value = _SAMPLE.match(line).groups()
                parsed = dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', labels or ""))
                self.samples[name].append((parsed, float(value)))

    def value(self, name: str, **labels) -> float:
        return sum(v for ls, v in self.samples[name]
                   if all(ls.get(k) == want for k, want in labels.items()))

    def labels(self, name: str) -> list[dict[str, str]]:
        return [ls for ls, _ in self.samples[name]]


def scrape(client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    return Scrape(response.text)


@pytest.fixture(scope="module")
def embed_server(engine, serve_app):
    """MiniLM behind its own app (fresh counters), with the separate metrics port."""
    with serve_app(engine, ServerSettings(prometheus_port=0)) as (url, app):
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client, app


def test_names_types_and_counts_add_up(embed_server):
    client, _ = embed_server
    # Each kind of request: TEI single and batch, OpenAI, vLLM pooling, an empty batch (400),
    # a classifier route on an embedder (424), a tokenizer route (not inference).
    texts = ["one", "two words", "a sentence of several more words"]
    assert client.post("/embed", json={"inputs": "hello"}).status_code == 200
    assert client.post("/embed", json={"inputs": texts}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": texts[:2]}).status_code == 200
    assert client.post("/pooling", json={"input": "pooled"}).status_code == 200
    assert client.post("/embed", json={"inputs": []}).status_code == 400
    assert client.post("/predict", json={"inputs": "x"}).status_code == 424
    assert client.post("/tokenize", json={"inputs": "not counted"}).status_code == 200
    m = scrape(client)

    for name, kind in {**TEI_TYPES, **VLLM_TYPES}.items():
        assert m.types.get(name) == kind, (name, m.types.get(name))
    # TEI's counters carry no `_total` (its exporter writes none); vLLM's do.
    assert "te_request_count_total" not in m.types and "te_request_count" in m.samples
    for name in VLLM_TYPES:
        sample = name if VLLM_TYPES[name] != "histogram" else name + "_count"
        assert m.labels(sample) and all(ls["model_name"] == "model" and ls["engine"] == "0"
                                        for ls in m.labels(sample)), name
    assert m.labels("vllm:request_success_total")[0]["finished_reason"] == "stop"
    # pooler's own names are still there, in the same exposition.
    assert m.types["pooler_http_requests_total"] == "counter"

    # Requests: 6 inference requests (the tokenizer route is not one); 4 answered.
    assert m.value("te_request_count", method="single") == 4  # hello, pooled, [], x
    assert m.value("te_request_count", method="batch") == 2
    assert m.value("te_request_success") == 4
    assert m.value("te_request_failure", err="validation") == 1
    assert m.value("te_request_failure", err="model_type") == 1
    assert m.value("te_request_count") == m.value("te_request_success") + \
        m.value("te_request_failure")
    for name in ("te_request_duration", "te_request_tokenization_duration",
                 "te_request_queue_duration", "te_request_inference_duration"):
        assert m.value(name + "_count") == 4, name
    # Inputs: 1 + 3 + 2 + 1 embedded, each one engine request.
    inputs = 7
    assert m.value("te_embed_count") == m.value("te_embed_success") == inputs
    assert m.value("te_predict_count") == 0
    assert m.value("vllm:request_success_total") == inputs
    for name in ("te_request_input_length", "vllm:request_prompt_tokens",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_inference_time_seconds"):
        assert m.value(name + "_count") == inputs, name
    assert m.value("te_batch_next_size_sum") == inputs
    # Tokens: every computed token is counted once per family.
    tokens = m.value("vllm:prompt_tokens_total")
    assert tokens > inputs
    assert m.value("te_batch_next_tokens_sum") == tokens
    assert m.value("te_request_input_length_sum") == tokens
    assert m.value("vllm:request_prompt_tokens_sum") == tokens
    # Idle: nothing waits or runs.
    assert m.value("te_queue_size") == m.value("vllm:num_requests_waiting") == 0
    assert m.value("vllm:num_requests_running") == 0
    # Units: seconds (an engine step of MiniLM on a few words is far below a second).
    assert 0 < m.value("vllm:request_inference_time_seconds_sum") / inputs < 5


def test_prometheus_port_serves_the_same_registry(embed_server):
    client, app = embed_server
    client.post("/embed", json={"inputs": "for the port"})
    port = app.state.prometheus_port
    on_port = Scrape(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
    on_route = scrape(client)
    assert on_port.types == on_route.types
    assert on_port.value("te_request_count") == on_route.value("te_request_count") >= 1


def test_predict_counts_on_a_classifier(classifier_server):
    url, _, _ = classifier_server
    with httpx.Client(base_url=url, timeout=60) as client:
        before = scrape(client)
        assert client.post("/predict", json={"inputs": [["good"], ["bad", "pair"]]}
                           ).status_code == 200
        assert client.post("/embed", json={"inputs": "x"}).status_code == 424
        after = scrape(client)
    delta = {name: after.value(name) - before.value(name)
             for name in ("te_predict_count", "te_predict_success", "te_embed_count",
                          "te_request_success", "vllm:request_success_total")}
    assert delta == {"te_predict_count": 2, "te_predict_success": 2, "te_embed_count": 0,
                     "te_request_success": 1, "vllm:request_success_total": 2}
    assert after.value("te_request_failure", err="model_type") - \
        before.value("te_request_failure", err="model_type") == 1


def test_several_models_keep_the_names_with_a_model_label(engine):
    """The multi-model router merges each app's /metrics: TEI's counters keep their bare
    names and TYPE lines, every sample gains `model`."""
    import asyncio

    from pooler.server.app import create_app
    from pooler.server.multi_model import ModelRouter, ServedModel

    served = [ServedModel(name, create_app(engine, ServerSettings(served_model_name=name),
                                           owns_engine=False), memory_mb=1.0)
              for name in ("a", "b")]

    async def scrape_router():
        transport = httpx.ASGITransport(app=ModelRouter(served))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return (await client.get("/metrics")).text

    m = Scrape(asyncio.run(scrape_router()))
    assert m.types["te_request_count"] == "counter"
    assert "te_request_count_total" not in m.types
    assert m.types["vllm:request_success_total"] == "counter"
    assert {ls["model"] for ls in m.labels("vllm:num_requests_waiting")} == {"a", "b"}
    assert {ls["model_name"] for ls in m.labels("vllm:num_requests_waiting")} == {"a", "b"}
