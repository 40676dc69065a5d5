"""Task routes against a real server: classify, score/rerank (cross-encoder and bi-encoder),
NER and sparse embeddings, compared with the offline Engine on the same model."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from pooler import Engine

@pytest.fixture(scope="module")
def classifier(classifier_server):
    url, engine, _ = classifier_server
    return url, engine


@pytest.fixture(scope="module")
def cross_encoder(cross_encoder_server):
    url, engine, app = cross_encoder_server
    return url, engine, app.state.pooler.model_name


DOCS = ["Paris is the capital of France.", "Cats sleep a lot.", "The Eiffel tower is in Paris.",
        "Tokyo is a large city."]


def test_pooling_precision_needs_a_vector_task(classifier):
    url, _ = classifier
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/pooling", json={"input": "great movie", "task": "classify",
                                     "precision": "int8"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "precision"
        assert "'embed' or 'token_embed'" in r.json()["error"]["message"]
        # The spec says so too: this model has no vector task, so only float32.
        spec = c.get("/openapi.json").json()["components"]["schemas"]["PoolingRequest"]
        prop = spec["properties"]["precision"]  # or null, meaning the default
        assert [o["enum"] for o in prop["anyOf"] if o.get("type") != "null"] == [["float32"]]


def test_invocations_spec_on_a_classifier_is_classify_truncation(cross_encoder):
    """/invocations hands a pooling body to /classify first on a classifier, which truncates
    from the right only: the spec must not promise left truncation there."""
    url, _, _ = cross_encoder
    with httpx.Client(base_url=url, timeout=60) as c:
        spec = c.get("/openapi.json").json()
        body = spec["paths"]["/invocations"]["post"]["requestBody"]["content"][
            "application/json"]["schema"]
        side = body["properties"]["truncation_side"]
        assert side["type"] == "null" and "anyOf" not in side and "enum" not in side
        r = c.post("/invocations", json={"input": "a", "task": "classify",
                                         "truncation_side": "left"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side"


def test_classify_and_predict(classifier):
    url, engine = classifier
    texts = ["great movie", "terrible plot", "it was fine"]
    expected = engine.classify(texts)
    with httpx.Client(base_url=url, timeout=60) as c:
        body = c.post("/classify", json={"input": texts}).json()
        for item, e in zip(body["data"], expected):
            assert item["label"] == e.label and item["num_classes"] == 3
            np.testing.assert_allclose(item["probs"], e.probs, atol=1e-6)
        single = c.post("/predict", json={"inputs": "great movie"}).json()
        assert single[0]["label"] == expected[0].label
        assert [x["score"] for x in single] == sorted((x["score"] for x in single), reverse=True)
        batch = c.post("/predict", json={"inputs": [[t] for t in texts]}).json()
        assert [b[0]["label"] for b in batch] == [e.label for e in expected]
        pooled = c.post("/pooling", json={"input": texts, "task": "classify"}).json()
        np.testing.assert_allclose(pooled["data"][0]["data"], expected[0].probs, atol=1e-6)


def test_score_routes(cross_encoder):
    url, engine, _ = cross_encoder
    expected = [o.score for o in engine.score("where is the eiffel tower?", DOCS)]
    with httpx.Client(base_url=url, timeout=60) as c:
        for path, body in (("/score", {"queries": "where is the eiffel tower?", "documents": DOCS}),
                           ("/v1/score", {"text_1": "where is the eiffel tower?", "text_2": DOCS})):
            r = c.post(path, json=body)
            assert r.status_code == 200, r.text
            got = [d["score"] for d in r.json()["data"]]
            np.testing.assert_allclose(got, expected, atol=1e-6)
        r = c.post("/score", json={"queries": ["a", "b"], "documents": ["c", "d", "e"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "documents"


def test_rerank_shapes(cross_encoder):
    url, engine, _ = cross_encoder
    query = "where is the eiffel tower?"
    expected = sorted(engine.rerank(query, DOCS), key=lambda r: -r.score)
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            r = c.post(path, json={"query": query, "documents": DOCS, "top_n": 2,
                                   "return_documents": True})
            assert r.status_code == 200, r.text
            results = r.json()["results"]
            assert [x["index"] for x in results] == [e.index for e in expected[:2]]
            assert results[0]["document"] == {"text": DOCS[expected[0].index]}
            np.testing.assert_allclose([x["relevance_score"] for x in results],
                                       [e.score for e in expected[:2]], atol=1e-6)
        tei = c.post("/rerank", json={"query": query, "texts": DOCS, "return_text": True}).json()
        assert [x["index"] for x in tei] == [e.index for e in expected]
        assert tei[0]["text"] == DOCS[expected[0].index]
        for bad in ({"query": query, "documents": []}, {"query": query, "documents": DOCS,
                                                         "top_n": -1}):
            r = c.post("/v1/rerank", json=bad)
            assert r.status_code == 400, r.text


def test_rerank_with_cohere_client(cross_encoder):
    cohere = pytest.importorskip("cohere")
    url, engine, name = cross_encoder
    query = "where is the eiffel tower?"
    expected = sorted(engine.rerank(query, DOCS), key=lambda r: -r.score)
    v2 = cohere.ClientV2(api_key="unused", base_url=url)
    response = v2.rerank(model=name, query=query, documents=DOCS, top_n=3)
    assert [r.index for r in response.results] == [e.index for e in expected[:3]]
    np.testing.assert_allclose([r.relevance_score for r in response.results],
                               [e.score for e in expected[:3]], atol=1e-6)
    v1 = cohere.Client(api_key="unused", base_url=url)
    response = v1.rerank(model=name, query=query, documents=DOCS, return_documents=True)
    assert response.results[0].document.text == DOCS[expected[0].index]


def test_ner_route(shared_model_path, serve_app):
    engine = Engine(str(shared_model_path("ner-pii-minilm")))
    text = "My name is John Smith and my email is john.smith@example.com."
    expected = engine.ner([text])[0]
    with serve_app(engine, owns_engine=True) as (url, _), httpx.Client(base_url=url) as c:
        r = c.post("/ner", json={"input": [text]})
        assert r.status_code == 200, r.text
        entities = r.json()["data"][0]["entities"]
    assert len(entities) == len(expected)
    for got, e in zip(entities, expected):
        assert (got["start"], got["end"]) == (e.start, e.end)
        assert text[got["start"]:got["end"]].strip() != ""
        assert got["score"] == pytest.approx(float(e.score), abs=1e-6)


def test_embed_sparse_route(shared_model_path, serve_app):
    engine = Engine(str(shared_model_path("splade-tiny")))
    texts = ["sparse retrieval with splade", "cats and dogs"]
    expected = engine.embed_sparse(texts)
    with serve_app(engine, owns_engine=True) as (url, _), httpx.Client(base_url=url) as c:
        r = c.post("/embed_sparse", json={"inputs": texts})
        assert r.status_code == 200, r.text
    for got, e in zip(r.json(), expected):
        assert [x["index"] for x in got] == [int(i) for i in e.indices]
        np.testing.assert_allclose([x["value"] for x in got], e.values, atol=1e-6)


def test_dimensions_on_a_declared_splade_model_is_a_400(shared_model_path, serve_app, tmp_path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    SparseEncoder(modules=[MLMTransformer(str(shared_model_path("splade-tiny"))),
                           SpladePooling("max")], device="cpu").save(str(tmp_path / "st"))
    engine = Engine(str(tmp_path / "st"))
    with serve_app(engine, owns_engine=True) as (url, _), httpx.Client(base_url=url) as c:
        r = c.post("/v1/embeddings", json={"input": "sparse", "dimensions": 8})
        assert r.status_code == 400, r.text
        assert "dimensions" in r.text and "top_k" in r.text
        assert c.post("/v1/embeddings", json={"input": "sparse"}).status_code == 200


def test_bi_encoder_score_and_rerank(url, engine):
    """An embedding model scores by cosine similarity, as sentence-transformers does."""
    query = "where is the eiffel tower?"
    expected = [o.score for o in engine.score(query, DOCS)]
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/score", json={"queries": query, "documents": DOCS})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose([d["score"] for d in r.json()["data"]], expected, atol=1e-5)
        r = c.post("/v1/rerank", json={"query": query, "documents": DOCS, "top_n": 1})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["index"] == int(np.argmax(expected)) == 2
