"""Drop-in residue (issue 28, part 5): each test uses the client or the body that failed."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

ATOL = 1e-5


@pytest.fixture
def hub(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    # The suite runs with HF_HUB_OFFLINE=1, which blocks the client even on 127.0.0.1.
    monkeypatch.setattr(hub.constants, "is_offline_mode", lambda: False)
    return hub


def test_inference_client_text_classification_on_predict(hub, classifier_server):
    url, engine, _ = classifier_server
    labels = hub.InferenceClient(base_url=f"{url}/predict").text_classification("great movie")
    want = engine.classify("great movie")[0].labels
    assert [x.label for x in labels] == [w["label"] for w in want]
    np.testing.assert_allclose([x.score for x in labels], [w["score"] for w in want], atol=ATOL)
    top1 = hub.InferenceClient(base_url=f"{url}/predict").text_classification(
        "great movie", top_k=1)
    assert [x.label for x in top1] == [want[0]["label"]]
    # TEI's own body on /predict keeps TEI's flat answer for one input.
    flat = httpx.post(f"{url}/predict", json={"inputs": "great movie"}).json()
    assert isinstance(flat, list) and isinstance(flat[0], dict)


def test_inference_client_token_classification_on_ner(hub, token_classifier_server):
    url, engine, _ = token_classifier_server
    text = "Ada Lovelace lived in London"
    entities = hub.InferenceClient(base_url=f"{url}/ner").token_classification(text)
    want = engine.ner(text)[0]
    assert [(e.entity_group, e.word, e.start, e.end) for e in entities] == \
        [(w.entity_group, w.word, w.start, w.end) for w in want]
    # pooler's own body is unchanged.
    r = httpx.post(f"{url}/ner", json={"input": text})
    assert r.status_code == 200 and r.json()["data"][0]["object"] == "entities"


def test_unknown_model_name_ignored_on_tei_shared_routes(client, url, engine):
    """A client set up for TEI (`model: "tei"`) or OpenAI works on /v1/embeddings."""
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(api_key="unused", base_url=f"{url}/v1")
    got = oa.embeddings.create(model="tei", input="hello")
    np.testing.assert_allclose(got.data[0].embedding, engine.embed("hello")[0].embedding,
                               atol=ATOL)
    assert got.model != "tei"  # the answer names the model that served it
    r = client.post("/embeddings", json={"model": "text-embedding-3-small", "input": "a"})
    assert r.status_code == 200
    # vLLM-only routes keep vLLM's 404 (docs/serving/http.md, "Model names").
    r = client.post("/pooling", json={"model": "gpt-4", "input": "a"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_cohere_rerank_with_cohere_model_name(cross_encoder_server):
    cohere = pytest.importorskip("cohere")
    url, engine, _ = cross_encoder_server
    docs = ["Paris is in France.", "Cats sleep a lot."]
    response = cohere.ClientV2(api_key="unused", base_url=url).rerank(
        model="rerank-v3.5", query="where is Paris?", documents=docs)
    want = {r.index: r.score for r in engine.rerank("where is Paris?", docs)}
    for result in response.results:
        np.testing.assert_allclose(result.relevance_score, want[result.index], atol=ATOL)


def test_classify_activation_is_use_activation(classifier_server):
    url, engine, _ = classifier_server
    with httpx.Client(base_url=url) as c:
        raw = c.post("/classify", json={"input": "great movie", "activation": False}).json()
        new = c.post("/classify", json={"input": "great movie",
                                        "use_activation": False}).json()
        default = c.post("/classify", json={"input": "great movie"}).json()
        assert raw["data"][0]["probs"] == new["data"][0]["probs"]
        assert raw["data"][0]["probs"] != default["data"][0]["probs"]
        assert sum(default["data"][0]["probs"]) == pytest.approx(1.0, abs=1e-5)
        r = c.post("/classify", json={"input": "a", "activation": False,
                                      "use_activation": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "activation"


def test_rerank_max_tokens_per_doc_cuts_an_overlong_document(cross_encoder_server):
    url, engine, _ = cross_encoder_server
    query = "where is Paris?"
    doc = "Paris is the capital of France. " + "It has many old bridges and museums. " * 200
    first = engine.tokenizer.encode_batch([doc], add_special_tokens=False)[0].input_ids[:8]
    cut = engine.tokenizer.decode(first, skip_special_tokens=True)
    with httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/rerank", json={"query": query, "documents": [doc],
                                    "max_tokens_per_doc": 8})
        assert r.status_code == 200, r.text
        want = c.post("/rerank", json={"query": query, "documents": [cut]}).json()
        got = r.json()
        np.testing.assert_allclose(got["results"][0]["relevance_score"],
                                   want["results"][0]["relevance_score"], atol=ATOL)
        assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
        # Without it an over-long pair is vLLM's 400.
        assert c.post("/rerank", json={"query": query, "documents": [doc]}).status_code == 400


@pytest.mark.parametrize("route", ["/v1/embeddings", "/pooling"])
@pytest.mark.parametrize("value,param_text", [("", "'input'"), (["a", ""], "input[1]")])
def test_empty_input_is_a_400_like_vllm(client, route, value, param_text):
    r = client.post(route, json={"input": value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and param_text in error["message"]


def test_explicit_null_means_unset(client, cross_encoder_server):
    url, _, _ = cross_encoder_server
    r = httpx.post(f"{url}/rerank", json={"query": "q", "documents": ["a", "b", "c"],
                                          "top_n": None, "max_tokens_per_doc": None})
    assert r.status_code == 200, r.text
    assert len(r.json()["results"]) == 3
    for route, body in (("/v1/embeddings", {"input": "a", "dimensions": None,
                                            "encoding_format": None, "truncate": None}),
                        ("/embed", {"inputs": "a", "normalize": None, "truncate": None}),
                        ("/v2/embed", {"texts": ["a"], "truncate": None,
                                       "embedding_types": None})):
        r = client.post(route, json=body)
        assert r.status_code == 200, (route, r.text)
    # A required field stays required.
    r = client.post("/v1/rerank", json={"query": None, "documents": ["a"]})
    assert r.status_code in (400, 404)


def test_pipeline_bodies_with_bad_parameters_are_client_errors(token_classifier_server,
                                                               classifier_server):
    """Found by the fuzzer: `parameters` that is not an object was a 500. (/predict then
    takes the body as TEI's, which ignores unknown fields.)"""
    for url, route in ((token_classifier_server[0], "/ner"), (classifier_server[0], "/")):
        r = httpx.post(f"{url}{route}", json={"inputs": "a", "parameters": [None, None]})
        assert r.status_code in (400, 422), (route, r.text)
