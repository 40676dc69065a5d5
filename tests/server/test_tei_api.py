"""TEI's routes, translated from text-embeddings-inference's router (router/src/http/server.rs,
types.rs), its router tests (router/tests/test_http_*.rs) and its published openapi.json:
every answer validates against TEI's schema, numbers equal the offline Engine's.

Each `# TEI:` comment names the TEI behaviour the assertions below it translate.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pooler import Engine
from tests.server.tei_schema import response_schema, validate

REFERENCE = Path(__file__).parent / "tei_reference"
LONG = "word " * 600  # > 512 tokens for MiniLM


def ok(r: httpx.Response, path: str):
    assert r.status_code == 200, r.text
    body = r.json()
    validate(response_schema(path, 200), body)
    return body


def tei_error(r: httpx.Response, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    validate("ErrorResponse", body)
    assert body["error_type"] == error_type
    return body["error"]


@pytest.fixture(scope="module")
def classifier(classifier_server):
    url, engine, _ = classifier_server
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c, engine


@pytest.fixture(scope="module")
def reranker(cross_encoder_server):
    url, engine, _ = cross_encoder_server
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c, engine


# ---- /embed ------------------------------------------------------------------------------------
def test_embed_mrl_matches_tei_snapshot(client, engine):
    # TEI: test_http_embed.rs::test_mrl_embeddings: all-MiniLM-L6-v2, "test", dimensions=128,
    # equal to TEI's snapshot within its 4e-3 tolerance; a batch of three equals the single.
    single = ok(client.post("/embed", json={"inputs": "test", "dimensions": 128}), "/embed")
    expected = json.loads((REFERENCE / "mrl_embeddings_single.json").read_text())
    assert len(single) == 1 and len(single[0]) == 128
    np.testing.assert_allclose(single[0], expected, atol=4e-3)
    batch = ok(client.post("/embed", json={"inputs": ["test"] * 3, "dimensions": 128}),
               "/embed")
    for row in batch:
        np.testing.assert_allclose(row, single[0], atol=1e-6)
    np.testing.assert_allclose(single[0], engine.embed("test", dimensions=128)[0].embedding,
                               atol=1e-6)


def test_embed_defaults_and_options(client, engine):
    # TEI: normalize defaults to true; normalize=false gives the raw pooled vector; token ids
    # are accepted as inputs (InputType::Ids).
    body = ok(client.post("/embed", json={"inputs": ["hello", "world"]}), "/embed")
    np.testing.assert_allclose(body, np.stack([o.embedding for o in engine.embed(
        ["hello", "world"])]), atol=1e-6)
    raw = ok(client.post("/embed", json={"inputs": "hello", "normalize": False}), "/embed")
    np.testing.assert_allclose(raw[0], engine.embed("hello", normalize=False)[0].embedding,
                               atol=1e-6)
    ids = engine.tokenizer.encode_batch(["hello"])[0].input_ids
    by_ids = ok(client.post("/embed", json={"inputs": ids}), "/embed")
    np.testing.assert_allclose(by_ids[0], body[0], atol=1e-6)
    mixed = ok(client.post("/embed", json={"inputs": [ids, "world"]}), "/embed")  # TEI: mixed
    np.testing.assert_allclose(mixed, body, atol=1e-6)


def test_auto_truncate_default_and_truncate_false(client, engine):
    # TEI >= 1.9: truncate unset -> auto_truncate (true); truncate=false on an over-long input
    # -> 422 Validation; the same on every TEI route that tokenizes.
    body = ok(client.post("/embed", json={"inputs": LONG}), "/embed")
    np.testing.assert_allclose(body[0], engine.embed(LONG)[0].embedding, atol=1e-6)
    left = ok(client.post("/embed", json={"inputs": LONG, "truncation_direction": "Left"}),
              "/embed")
    np.testing.assert_allclose(left[0], engine.embed(
        LONG, truncation_direction="left")[0].embedding, atol=1e-6)
    for path, payload in (("/embed", {"inputs": LONG}), ("/embed_all", {"inputs": LONG}),
                          ("/similarity", {"inputs": {"source_sentence": LONG,
                                                      "sentences": ["a"]},
                                           "parameters": {"truncate": False}})):
        if "parameters" not in payload:
            payload = {**payload, "truncate": False}
        message = tei_error(client.post(path, json=payload), 422, "Validation")
        assert "tokens" in message
    ok(client.post("/embed_all", json={"inputs": LONG}), "/embed_all")


def test_empty_batch_is_400_empty(client):
    # TEI: an empty batch is 400 with error_type Empty ("`inputs` cannot be empty").
    for path, payload in (("/embed", {"inputs": []}), ("/embed_all", {"inputs": []}),
                          ("/tokenize", {"inputs": []}), ("/decode", {"ids": []}),
                          ("/similarity", {"inputs": {"source_sentence": "a",
                                                      "sentences": []}})):
        assert "cannot be empty" in tei_error(client.post(path, json=payload), 400, "Empty")


def test_bad_body_and_dimensions_are_422_validation(client):
    # TEI: a body that does not deserialize, or dimensions 0 / above the model's size -> 422.
    tei_error(client.post("/embed", json={"inputs": 3}), 422, "Validation")
    tei_error(client.post("/embed", json={}), 422, "Validation")
    assert "dimensions" in tei_error(client.post("/embed", json={"inputs": "a",
                                                                 "dimensions": 0}),
                                     422, "Validation")
    tei_error(client.post("/embed", json={"inputs": "a", "dimensions": 1000}), 422,
              "Validation")


def test_wrong_model_type_is_424(client):
    # TEI: /predict and /rerank on an embedding model -> 424 Backend; /embed_sparse on a model
    # without SPLADE pooling -> 424.
    assert "not a classifier" in tei_error(client.post("/predict", json={"inputs": "a"}),
                                           424, "Backend")
    assert "re-ranker" in tei_error(client.post("/rerank", json={"query": "a", "texts": ["b"]}),
                                    424, "Backend")
    assert "SPLADE" in tei_error(client.post("/embed_sparse", json={"inputs": "a"}), 424,
                                 "Backend")


def test_batch_size_limit_is_validation(engine, serve_app):
    # TEI: more inputs than max_client_batch_size -> error_type Validation (status 422, as
    # StatusCode::from(Validation); the spec documents 413).
    from pooler.server.settings import ServerSettings

    with serve_app(engine, ServerSettings(max_input_items=2)) as (url, _):
        r = httpx.post(f"{url}/embed", json={"inputs": ["a", "b", "c"]}, timeout=60)
        assert "3 items" in tei_error(r, 422, "Validation")
        info = httpx.get(f"{url}/info", timeout=60).json()
        assert info["max_client_batch_size"] == 2


# ---- /embed_all, /similarity, /embeddings ---------------------------------------------------
def test_embed_all(client, engine):
    body = ok(client.post("/embed_all", json={"inputs": ["hello world", "a"]}), "/embed_all")
    for got, o in zip(body, engine.token_embed(["hello world", "a"], normalize=False)):
        np.testing.assert_allclose(got, o.embeddings, atol=1e-6)


def test_similarity_is_sentence_transformers_cosine(client, st_minilm):
    # TEI: /similarity = 1 - cosine distance of source_sentence with each sentence, embedded
    # without normalization (sentence-transformers' model.similarity).
    source, sentences = "A man is eating food.", ["A man eats.", "A plane flies.", "Food."]
    body = ok(client.post("/similarity", json={"inputs": {"source_sentence": source,
                                                          "sentences": sentences}}),
              "/similarity")
    vectors = st_minilm.encode([source, *sentences], convert_to_tensor=True)
    expected = st_minilm.similarity(vectors[:1], vectors[1:])[0].numpy()
    np.testing.assert_allclose(body, expected, atol=1e-5)


def test_openai_alias_embeddings(client, engine):
    # TEI: /embeddings is the OpenAI route under another path; model may be any name.
    body = client.post("/embeddings", json={"input": ["hi"], "model": "anything"}).json()
    np.testing.assert_allclose(body["data"][0]["embedding"], engine.embed("hi")[0].embedding,
                               atol=1e-6)


# ---- /tokenize, /decode -------------------------------------------------------------------------
def test_tokenize_and_decode(client, engine):
    body = ok(client.post("/tokenize", json={"inputs": "hello world"}), "/tokenize")
    ids = engine.tokenizer.encode_batch(["hello world"])[0].input_ids
    assert [t["id"] for t in body[0]] == ids
    assert body[0][1] == {"id": ids[1], "text": "hello", "special": False, "start": 0, "stop": 5}
    no_special = ok(client.post("/tokenize", json={"inputs": ["hello"],
                                                   "add_special_tokens": False}), "/tokenize")
    assert [t["id"] for t in no_special[0]] == ids[1:2]
    assert ok(client.post("/decode", json={"ids": ids}), "/decode") == ["hello world"]
    assert ok(client.post("/decode", json={"ids": [ids, ids[1:2]],
                                           "skip_special_tokens": False}),
              "/decode") == ["[CLS] hello world [SEP]", "hello"]
    tei_error(client.post("/decode", json={"ids": [10 ** 9]}), 422, "Validation")


# ---- /info, /health, GET / , /ping, POST / --------------------------------------------------
def test_info_has_every_tei_field(client, engine):
    # TEI: Info schema (TEI's python client reads model_type, max_input_length, ...).
    info = client.get("/info").json()
    validate("Info", info)
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["auto_truncate"] is True
    assert info["max_input_length"] == engine.model_config.max_model_len
    assert info["served_model_name"] == info["model_id"]


def test_health_routes(client):
    # TEI: GET /health, GET / and GET /ping answer 200 once the model is ready.
    for path in ("/health", "/", "/ping"):
        assert client.get(path).status_code == 200


def test_post_root_dispatches_by_model_type(client, engine, classifier, reranker):
    # TEI: POST / is /embed for an embedder, /predict for a classifier, /rerank for a reranker.
    body = ok(client.post("/", json={"inputs": "hello"}), "/embed")
    np.testing.assert_allclose(body[0], engine.embed("hello")[0].embedding, atol=1e-6)
    similarity = client.post("/", json={"inputs": {"source_sentence": "a", "sentences": ["b"]}})
    assert similarity.status_code == 200 and len(similarity.json()) == 1
    c, cls_engine = classifier
    pred = ok(c.post("/", json={"inputs": "great movie"}), "/predict")
    assert pred[0]["label"] == cls_engine.classify("great movie")[0].label
    c, ce_engine = reranker
    ranks = ok(c.post("/", json={"query": "q", "texts": ["a", "b"]}), "/rerank")
    assert sorted(r["index"] for r in ranks) == [0, 1]


# ---- /predict ----------------------------------------------------------------------------------
def test_predict_shapes(classifier):
    # TEI: PredictInput: "text" | ["text"] | ["text", "pair"] (single) | [["a"], ["b", "c"]]
    # (batch); single -> [Prediction], batch -> [[Prediction]]; scores best first; a batch of
    # the same text equals the single answer (test_http_predict.rs).
    c, engine = classifier
    single = ok(c.post("/predict", json={"inputs": "test"}), "/predict")
    assert [p["score"] for p in single] == sorted((p["score"] for p in single), reverse=True)
    expected = engine.classify("test")[0]
    assert single[0]["label"] == expected.label
    np.testing.assert_allclose(single[0]["score"], expected.score, atol=1e-6)
    batch = ok(c.post("/predict", json={"inputs": [["test"]] * 5}), "/predict")
    assert len(batch) == 5 and all(b == single for b in batch)
    assert ok(c.post("/predict", json={"inputs": ["test"]}), "/predict") == single
    pair = ok(c.post("/predict", json={"inputs": ["a question", "an answer"]}), "/predict")
    pair_expected = engine.classify("a question", text_pair="an answer")[0]
    assert pair[0]["label"] == pair_expected.label
    np.testing.assert_allclose(pair[0]["score"], pair_expected.score, atol=1e-6)
    pairs = ok(c.post("/predict", json={"inputs": [["a question", "an answer"]] * 2}),
               "/predict")
    assert pairs == [pair, pair]
    mixed = ok(c.post("/predict", json={"inputs": [["test"], ["a question", "an answer"],
                                                   ["test"]]}), "/predict")
    assert mixed == [single, pair, single]
    raw = ok(c.post("/predict", json={"inputs": "test", "raw_scores": True}), "/predict")
    logits = engine.classify("test", use_activation=False)[0].probs
    np.testing.assert_allclose(sorted((p["score"] for p in raw), reverse=True),
                               sorted(logits, reverse=True), atol=1e-5)
    # TEI rejects a flat list of more than two strings (it would be ambiguous with a pair).
    tei_error(c.post("/predict", json={"inputs": ["a", "b", "c"]}), 422, "Validation")
    tei_error(c.post("/predict", json={"inputs": [["a", "b", "c"]]}), 422, "Validation")
    assert "cannot be empty" in tei_error(c.post("/predict", json={"inputs": []}), 400, "Empty")


# ---- /rerank -----------------------------------------------------------------------------------
def test_rerank_tei_shape(reranker):
    # TEI: test_http_rerank.rs: texts ["test", "other", "test"], return_text -> the two equal
    # texts tie at the top with index 2 before index 0; each rank carries its text.
    c, engine = reranker
    ranks = ok(c.post("/rerank", json={"query": "test", "texts": ["test", "other", "test"],
                                       "return_text": True}), "/rerank")
    expected = {r.index: r.score for r in engine.rerank("test", ["test", "other", "test"])}
    for rank in ranks:
        np.testing.assert_allclose(rank["score"], expected[rank["index"]], atol=1e-6)
        assert rank["text"] == ["test", "other", "test"][rank["index"]]
    scores = [r["score"] for r in ranks]
    assert scores == sorted(scores, reverse=True)
    if ranks[0]["score"] == ranks[1]["score"]:
        assert [ranks[0]["index"], ranks[1]["index"]] == [2, 0]
    plain = ok(c.post("/rerank", json={"query": "test", "texts": ["a", "b"]}), "/rerank")
    assert all("text" not in r for r in plain)
    raw = ok(c.post("/rerank", json={"query": "q", "texts": ["a"], "raw_scores": True}),
             "/rerank")
    logit = engine.classify("q", text_pair="a", use_activation=False)[0].probs[0]
    np.testing.assert_allclose(raw[0]["score"], logit, atol=1e-5)
    assert "cannot be empty" in tei_error(c.post("/rerank", json={"query": "q", "texts": []}),
                                          400, "Empty")
    message = tei_error(c.post("/rerank", json={"query": "q", "texts": [LONG],
                                                "truncate": False}), 422, "Validation")
    assert "tokens" in message
    ok(c.post("/rerank", json={"query": "q", "texts": [LONG]}), "/rerank")
    # Cohere/vLLM bodies on the same path still get their own shape.
    cohere = c.post("/rerank", json={"query": "q", "documents": ["a"]})
    assert cohere.status_code == 200 and "results" in cohere.json()


def test_classifier_info_and_embed_is_424(classifier, reranker):
    c, engine = classifier
    info = c.get("/info").json()
    validate("Info", info)
    assert info["model_type"] == {"classifier": {
        "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
        "label2id": {"negative": 0, "neutral": 1, "positive": 2}}}
    assert "not an embedding" in tei_error(c.post("/embed", json={"inputs": "a"}), 424,
                                           "Backend")
    c, _ = reranker
    info = c.get("/info").json()
    validate("Info", info)
    assert list(info["model_type"]) == ["reranker"]


@pytest.fixture(scope="module")
def splade(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("mlm"), minilm_path, "BertForMaskedLM", 2)
    engine = Engine(str(folder))
    with serve_app(engine, owns_engine=True) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as c:
            yield c, engine


def test_embed_sparse_and_root_on_a_splade_model(splade):
    # TEI: /embed_sparse -> [[{index, value}]]; POST / on a SPLADE model is /embed_sparse;
    # Info says pooling "splade".
    c, engine = splade
    body = ok(c.post("/embed_sparse", json={"inputs": ["hello world", "a"]}), "/embed_sparse")
    for got, want in zip(body, engine.embed_sparse(["hello world", "a"])):
        assert [g["index"] for g in got] == [int(i) for i in want.indices]
        np.testing.assert_allclose([g["value"] for g in got], want.values, atol=1e-5)
    # POST / answers as /embed_sparse. Same indices; values equal up to float rounding, since
    # the step's thread count (pooler/cpu_contention.py) may differ between two calls on a
    # busy machine and with it the order of a GEMM's partial sums.
    # Compared as {index: value}: near-equal weights may swap places in the largest-first
    # order, and a weight at the edge of zero may be listed in one answer only.
    root = ok(c.post("/", json={"inputs": ["hello world", "a"]}), "/embed_sparse")
    assert len(root) == len(body)
    for got, want in zip(root, body):
        got, want = ({g["index"]: g["value"] for g in r} for r in (got, want))
        keys = sorted(got.keys() | want.keys())
        np.testing.assert_allclose([got.get(k, 0.0) for k in keys],
                                   [want.get(k, 0.0) for k in keys], rtol=1e-6, atol=1e-6)
    info = c.get("/info").json()
    validate("Info", info)
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}


def test_predict_truncation_like_every_route(classifier):
    # TEI >= 1.9 on /predict: auto-truncate by default, truncate=false -> 422.
    c, engine = classifier
    body = ok(c.post("/predict", json={"inputs": LONG}), "/predict")
    assert body[0]["label"] == engine.classify(LONG)[0].label
    tei_error(c.post("/predict", json={"inputs": LONG, "truncate": False}), 422, "Validation")


def test_overloaded_is_429_and_bad_json_is_422(engine, serve_app):
    # TEI: more work than the server admits -> 429 Overloaded; a body that is not JSON -> 422.
    from pooler.server.settings import ServerSettings

    with serve_app(engine, ServerSettings(max_queue=1)) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as c:
            tei_error(c.post("/embed", json={"inputs": ["a", "b"]}), 429, "Overloaded")
            tei_error(c.post("/embed", content=b"{nope",
                             headers={"content-type": "application/json"}), 422, "Validation")


def test_health_routes_are_open_with_an_api_key(engine, serve_app):
    # TEI: /health, / and /ping are public routes; POST / needs the key like every other.
    from pooler.server.settings import ServerSettings

    with serve_app(engine, ServerSettings(api_key="k")) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as c:
            for path in ("/health", "/", "/ping"):
                assert c.get(path).status_code == 200, path
            assert c.post("/", json={"inputs": "a"}).status_code == 401
            assert c.post("/", json={"inputs": "a"},
                          headers={"Authorization": "Bearer k"}).status_code == 200


def test_prompt_name_errors_list_the_prompts(client):
    # TEI: an unknown prompt_name is 422 Validation; tei-client parses "Available prompts".
    message = tei_error(client.post("/tokenize", json={"inputs": "a", "prompt_name": "nope"}),
                        422, "Validation")
    assert "no prompts were found" in message
    tei_error(client.post("/embed", json={"inputs": "a", "prompt_name": "nope"}), 422,
              "Validation")
