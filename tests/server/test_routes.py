"""Happy paths of the vLLM, TEI and common routes this branch can serve with MiniLM."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from pooler.params import PoolingParams


def test_pooling_embed_and_token_embed(client, engine):
    r = client.post("/pooling", json={"input": ["a cat", "a dog"], "task": "embed"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("pool-")
    expected = engine.embed(["a cat", "a dog"])
    for item, e in zip(body["data"], expected):
        assert item["object"] == "pooling"
        np.testing.assert_array_equal(np.array(item["data"], np.float32), e.embedding)
    assert body["usage"]["prompt_tokens"] == sum(e.num_tokens for e in expected)

    r = client.post("/pooling", json={"input": "a cat", "task": "token_embed",
                                      "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    flat = np.frombuffer(base64.b64decode(r.json()["data"][0]["data"]), "<f4")
    expected = engine.encode("a cat", PoolingParams(task="token_embed"))[0].data
    np.testing.assert_array_equal(flat.reshape(expected.shape), expected)


def test_tei_embed_and_embed_all(client, engine):
    r = client.post("/embed", json={"inputs": ["hello", "world"]})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array(r.json(), np.float32),
                                  np.stack([e.embedding for e in engine.embed(["hello", "world"])]))
    r = client.post("/embed", json={"inputs": "hello", "normalize": False,
                                    "truncation_direction": "Left"})
    assert r.status_code == 200
    np.testing.assert_array_equal(np.array(r.json()[0], np.float32),
                                  engine.embed("hello", normalize=False)[0].embedding)
    r = client.post("/embed_all", json={"inputs": ["hello world"]})
    assert r.status_code == 200, r.text
    tokens = np.array(r.json()[0], np.float32)
    expected = engine.token_embed("hello world", normalize=False)[0].embeddings
    np.testing.assert_array_equal(tokens, expected)


def test_tokenize_vllm_and_tei_shapes(client, engine):
    r = client.post("/tokenize", json={"prompt": "hello world", "return_token_strs": True})
    assert r.status_code == 200, r.text
    ids = engine.tokenizer.encode_batch(["hello world"])[0].input_ids
    assert r.json() == {"count": len(ids), "max_model_len": engine.model_config.max_model_len,
                        "tokens": ids, "token_strs": ["[CLS]", "hello", "world", "[SEP]"]}
    r = client.post("/tokenize", json={"inputs": ["hello world"]})
    assert r.status_code == 200, r.text
    tokens = r.json()[0]
    assert [t["id"] for t in tokens] == ids
    assert tokens[1] == {"id": ids[1], "text": "hello", "special": False, "start": 0, "stop": 5}
    assert tokens[0]["special"] and tokens[0]["start"] is None


def test_detokenize_and_decode(client):
    r = client.post("/detokenize", json={"tokens": [101, 7592, 2088, 102]})
    assert r.status_code == 200
    assert r.json() == {"prompt": "[CLS] hello world [SEP]"}
    r = client.post("/decode", json={"ids": [[101, 7592, 102], [2088]]})
    assert r.status_code == 200
    assert r.json() == ["hello", "world"]


def test_info_health_models_openapi(client, engine):
    info = client.get("/info").json()
    assert info["tasks"] == sorted(engine.supported_tasks)
    assert info["embedding_dimensions"] == 384
    assert info["max_input_length"] == engine.model_config.max_model_len
    assert client.get("/health").json() == {"status": "ok"}
    spec = client.get("/openapi.json").json()
    for path in ("/v1/embeddings", "/v1/models", "/pooling", "/score",
                 "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize",
                 "/embed", "/embed_all", "/info", "/health", "/metrics"):
        assert path in spec["paths"], path
    # The spec is the served model's (pooler/server/openapi_spec.py): an embedder does not
    # promise classification, NER or sparse vectors; those routes still answer a clear 400.
    for path in ("/classify", "/predict", "/ner", "/embed_sparse"):
        assert path not in spec["paths"], path
    assert client.post("/classify", json={"input": "a"}).status_code == 400


def test_metrics_count_requests_by_route_and_status(client):
    client.post("/embed", json={"inputs": "metrics probe"})
    client.post("/embed", json={"inputs": []})
    text = client.get("/metrics").text
    assert 'pooler_http_requests_total{method="POST",route="/embed",status="200"}' in text
    assert 'pooler_http_requests_total{method="POST",route="/embed",status="400"}' in text
    for name in ("pooler_queue_size", "pooler_batch_tokens_bucket", "pooler_batch_requests_bucket",
                 "pooler_inference_seconds_bucket", "pooler_queue_seconds_bucket",
                 "pooler_tokenize_seconds_bucket", "pooler_http_request_duration_seconds_bucket"):
        assert name in text, name


@pytest.mark.parametrize("path,body", [
    ("/classify", {"input": "x"}),
    ("/ner", {"input": "x"}),
    ("/pooling", {"input": "x", "task": "classify"}),
])
def test_tasks_the_embedding_model_lacks_are_clean_400s(client, path, body):
    """(TEI's /predict and /embed_sparse answer 424 as TEI does: test_tei_api.py.)"""
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "does not support" in error["message"]
    if path in ("/classify", "/pooling"):  # vLLM's routes: vLLM's error shape and words
        assert error["code"] == 400 and error["type"] == "BadRequestError"
        assert error["message"].startswith("Unsupported task: 'classify'")
    else:
        assert error["code"] == "unsupported_task"
