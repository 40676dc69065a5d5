"""vLLM's scoring entrypoint tests (tests/entrypoints/pooling/scoring/test_cross_encoder_online.py,
test_max_tokens_per_doc.py, classify/test_online.py's score/rerank/use_activation cases),
translated: a tiny seeded cross-encoder (one label, max_model_len 64), a 2-label classifier
(which vLLM does not score with) and the MiniLM bi-encoder; every body validated against
vLLM's protocol and the scores compared with the offline Engine."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from pooler import Engine
from tests.server import vllm_schema as vs

QUERIES = ["What is the capital of France?", "What is the capital of Germany?"]
DOCS = ["The capital of France is Paris.", "The capital of Germany is Berlin."]
MAX_LEN = 64


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("rr"), minilm_path,
                        "BertForSequenceClassification", 1)
    engine = Engine(str(folder), max_model_len=MAX_LEN)
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


@pytest.fixture(scope="module")
def two_label_classifier(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("c2"), minilm_path,
                        "BertForSequenceClassification", 2)
    engine = Engine(str(folder))
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


def _score(client, body) -> vs.ScoreResponse:
    r = client.post("/score", json=body)
    assert r.status_code == 200, r.text
    return vs.ScoreResponse.model_validate(r.json())


@pytest.mark.parametrize("sides", [("queries", "documents"), ("queries", "items"),
                                   ("data_1", "data_2"), ("text_1", "text_2")])
def test_score_spellings_pairwise(reranker, sides):
    client, engine = reranker
    body = _score(client, {sides[0]: QUERIES, sides[1]: DOCS})
    assert body.id and len(body.data) == 2
    expected = [o.score for o in engine.score(QUERIES, DOCS)]
    np.testing.assert_allclose([d.score for d in body.data], expected, atol=1e-6)
    assert body.usage.prompt_tokens == sum(o.num_tokens for o in engine.score(QUERIES, DOCS))


def test_score_one_to_one_and_one_to_many(reranker):
    client, engine = reranker
    for docs in (DOCS[0], DOCS):
        body = _score(client, {"queries": QUERIES[0], "documents": docs})
        expected = [o.score for o in engine.score(QUERIES[0], docs)]
        np.testing.assert_allclose([d.score for d in body.data], expected, atol=1e-6)
    r = client.post("/v1/score", json={"queries": QUERIES[0], "documents": DOCS})
    assert vs.ScoreResponse.model_validate(r.json()).data[1].index == 1


def test_rerank_validates_and_top_n(reranker):
    client, engine = reranker
    docs = ["The capital of Brazil is Brasilia.", "The capital of France is Paris.",
            "Cross-encoder models are neat"]
    expected = sorted(engine.score(QUERIES[0], docs), key=lambda o: -o.score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        for top_n, n in ((0, 3), (2, 2), (9, 3)):
            r = client.post(path, json={"query": QUERIES[0], "documents": docs,
                                        "top_n": top_n})
            body = vs.RerankResponse.model_validate(r.json())
            assert [x.index for x in body.results] == [o.document_index for o in expected[:n]]
            assert [x.document.text for x in body.results] == [docs[x.index]
                                                              for x in body.results]
            np.testing.assert_allclose([x.relevance_score for x in body.results],
                                       [o.score for o in expected[:n]], atol=1e-6)
            assert body.usage.prompt_tokens == body.usage.total_tokens > 0
    r = client.post("/v1/rerank", json={"query": "q", "documents": docs, "top_n": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_n"


def test_use_activation_gives_raw_logits(reranker):
    client, _ = reranker

    def scores(use_activation):
        r = client.post("/rerank", json={"query": QUERIES[0], "documents": DOCS,
                                         "use_activation": use_activation})
        results = sorted(r.json()["results"], key=lambda x: x["index"])
        return np.asarray([x["relevance_score"] for x in results])

    default, with_act, raw = scores(None), scores(True), scores(False)
    np.testing.assert_allclose(default, with_act, atol=1e-7)
    assert not np.allclose(with_act, raw, atol=1e-2)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), with_act, atol=1e-6)
    body = _score(client, {"queries": QUERIES[0], "documents": DOCS, "use_activation": False})
    np.testing.assert_allclose([d.score for d in body.data], raw, atol=1e-6)


def test_over_long_pairs_are_400s_unless_truncation_is_asked(reranker):
    client, engine = reranker
    long_query = "What is the capital of France? " * 20
    for path, body in (("/rerank", {"query": long_query, "documents": DOCS}),
                       ("/score", {"queries": long_query, "documents": DOCS})):
        r = client.post(path, json=body)
        assert r.status_code == 400
        error = vs.ErrorResponse.model_validate(r.json()).error
        assert error.type == "BadRequestError"
        assert "Please reduce the length of the input prompt" in error.message
        assert f"maximum context length is {MAX_LEN} tokens" in error.message
        r = client.post(path, json={**body, "truncate_prompt_tokens": MAX_LEN + 1})
        assert r.status_code == 400
        assert "Please request a smaller truncation size." in r.json()["error"]["message"]
    for limit in (-1, MAX_LEN):
        body = _score(client, {"queries": long_query, "documents": DOCS,
                               "truncate_prompt_tokens": limit})
        assert body.usage.prompt_tokens == 2 * MAX_LEN
        expected = engine.score(long_query, DOCS, truncate_prompt_tokens=MAX_LEN)
        np.testing.assert_allclose([d.score for d in body.data], [o.score for o in expected],
                                   atol=1e-6)


def test_max_tokens_per_doc(reranker, minilm_path):
    from transformers import AutoTokenizer

    client, engine = reranker
    query = "What is the capital of France?"
    doc = "The capital of France is Paris. " * 5
    full = vs.RerankResponse.model_validate(client.post("/rerank", json={
        "query": query, "documents": [doc]}).json())
    cut = vs.RerankResponse.model_validate(client.post("/rerank", json={
        "query": query, "documents": [doc], "max_tokens_per_doc": 5}).json())
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    q_ids = tokenizer.encode(query, add_special_tokens=False)
    assert cut.usage.prompt_tokens == len(q_ids) + 5 + 3 < full.usage.prompt_tokens
    # The same as scoring the pair with the document cut to its first 5 tokens.
    first5 = tokenizer.decode(tokenizer.encode(doc, add_special_tokens=False)[:5])
    np.testing.assert_allclose(cut.results[0].relevance_score,
                               engine.score(query, first5)[0].score, atol=1e-6)
    long_doc = "The capital of France is Paris. " * 50  # over max_model_len without the cap
    r = client.post("/rerank", json={"query": query, "documents": [long_doc, "short"],
                                     "max_tokens_per_doc": 10})
    assert vs.RerankResponse.model_validate(r.json()).usage.prompt_tokens > 0
    for bad in (0, -5):
        r = client.post("/rerank", json={"query": query, "documents": [doc],
                                         "max_tokens_per_doc": bad})
        assert r.status_code == 400
        assert "max_tokens_per_doc must be a positive integer" in r.text


def test_pooling_and_invocations_on_a_reranker(reranker, minilm_path):
    client, engine = reranker
    text = "This product was excellent and exceeded my expectations"
    r = client.post("/pooling", json={"input": text, "task": "classify"})
    body = vs.PoolingResponse.model_validate(r.json())
    assert len(body.data) == 1 and len(body.data[0].data) == 1
    for task in ("embed", "token_embed", "plugin"):
        r = client.post("/pooling", json={"input": text, "task": task})
        error = vs.ErrorResponse.model_validate(r.json()).error
        assert error.type == "BadRequestError"
        assert error.message.startswith(f"Unsupported task: {task!r}")
    args = {"query": QUERIES[0], "documents": DOCS}
    direct, invoked = client.post("/rerank", json=args).json(), \
        client.post("/invocations", json=args).json()
    assert direct.keys() == invoked.keys()
    for a, b in zip(direct["results"], invoked["results"]):
        assert a.keys() == b.keys() and a["relevance_score"] == pytest.approx(
            b["relevance_score"], abs=1e-6)
    scored = client.post("/invocations", json={"queries": QUERIES, "documents": DOCS}).json()
    assert vs.ScoreResponse.model_validate(scored).data[0].object == "score"


def test_a_multi_label_classifier_has_no_score_or_rerank(two_label_classifier):
    client, engine = two_label_classifier
    for path, body in (("/score", {"queries": "ping", "documents": "pong"}),
                       ("/rerank", {"query": "ping", "documents": ["pong"]})):
        r = client.post(path, json=body)
        assert r.status_code == 404 and r.json()["detail"] == "Not Found"
    # TEI's rerank body on the shared path still reaches TEI's handler.
    assert client.post("/rerank", json={"query": "ping", "texts": ["pong"]}).status_code != 404
    text = "This product was excellent and exceeded my expectations"

    def probs(use_activation):
        r = client.post("/classify", json={"input": text, "use_activation": use_activation})
        return np.asarray(vs.ClassificationResponse.model_validate(r.json()).data[0].probs)

    default, with_act, raw = probs(None), probs(True), probs(False)
    np.testing.assert_allclose(default, with_act, atol=1e-7)
    assert not np.allclose(with_act, raw, atol=1e-2)
    np.testing.assert_allclose(np.exp(raw) / np.exp(raw).sum(), with_act, atol=1e-6)
    pooled = vs.PoolingResponse.model_validate(client.post("/pooling", json={
        "input": text, "task": "classify"}).json())
    assert len(pooled.data[0].data) == 2


def test_classify_inputs_and_errors(two_label_classifier, minilm_path):
    from transformers import AutoTokenizer

    client, engine = two_label_classifier
    text = "This product was excellent and exceeded my expectations"
    ids = AutoTokenizer.from_pretrained(str(minilm_path)).encode(text)
    for inputs, n in ((text, 1), (ids, 1), ([text] * 4, 4), ([ids] * 4, 4)):
        r = client.post("/classify", json={"input": inputs})
        body = vs.ClassificationResponse.model_validate(r.json())
        assert [d.index for d in body.data] == list(range(n))
        assert all(len(d.probs) == d.num_classes == 2 for d in body.data)
        np.testing.assert_allclose(body.data[0].probs, engine.classify([text])[0].probs,
                                   atol=1e-6)
    r = client.post("/classify", json={"input": "hello " * 600, "truncate_prompt_tokens": 5})
    body = vs.ClassificationResponse.model_validate(r.json())
    assert body.usage.prompt_tokens == body.usage.total_tokens == 5
    r = client.post("/classify", json={"input": "test", "truncate_prompt_tokens": 513})
    assert r.status_code == 400 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    r = client.post("/classify", json={"input": []})
    assert r.status_code == 400 and "error" in r.json()
    for add_special in (False, True):
        r = client.post("/classify", json={"input": text, "add_special_tokens": add_special})
        body = vs.ClassificationResponse.model_validate(r.json())
        assert body.usage.prompt_tokens == len(ids) - (0 if add_special else 2)


def test_bi_encoder_score_and_rerank(client, engine):
    query = "where is the eiffel tower?"
    body = _score(client, {"queries": query, "documents": DOCS})
    expected = engine.score(query, DOCS)
    np.testing.assert_allclose([d.score for d in body.data], [o.score for o in expected],
                               atol=1e-6)
    assert body.usage.prompt_tokens == sum(o.num_tokens for o in expected)
    r = client.post("/rerank", json={"query": query, "documents": DOCS, "top_n": 0})
    rerank = vs.RerankResponse.model_validate(r.json())
    assert len(rerank.results) == len(DOCS)
    assert rerank.usage.prompt_tokens == body.usage.prompt_tokens


def test_colbert_score_and_rerank(tmp_path_factory, serve_app):
    """vLLM scores late-interaction (ColBERT) models on /score and /rerank too (MaxSim)."""
    from tests.models.colbert_folders import build_tiny_stanford

    engine = Engine(str(build_tiny_stanford(tmp_path_factory.mktemp("colbert") / "m")))
    query = QUERIES[0]
    expected = engine.score(query, DOCS)
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        body = _score(client, {"queries": query, "documents": DOCS})
        np.testing.assert_allclose([d.score for d in body.data], [o.score for o in expected],
                                   atol=1e-5)
        assert body.usage.prompt_tokens == sum(o.num_tokens for o in expected) > 0
        r = client.post("/rerank", json={"query": query, "documents": DOCS})
        rerank = vs.RerankResponse.model_validate(r.json())
        best = max(expected, key=lambda o: o.score)
        assert rerank.results[0].index == best.document_index
        assert rerank.usage.prompt_tokens == body.usage.prompt_tokens
        r = client.post("/rerank", json={"query": query, "documents": DOCS,
                                         "max_tokens_per_doc": 4})
        assert r.status_code == 400 and "ColBERT" in r.json()["error"]["message"]
