"""Bad requests get 4xx JSON errors in the OpenAI shape naming the field; limits; auth."""
from __future__ import annotations

import httpx
import pytest

from pooler.server.state import ServerSettings


def assert_error(r: httpx.Response, status: int, param: str | None = None,
                 contains: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param, error
    if contains is not None:
        assert contains in error["message"], error
    return error


@pytest.mark.parametrize("body,param,contains", [
    ({"input": 5}, "input", "expected a string"),
    ({"input": [1.5]}, "input", "expected a string"),
    ({"input": ["a", 3]}, "input", None),
    ({"input": {"text": "a"}}, "input", None),
    ({"input": [True]}, "input", None),
    ({"input": []}, "input", "empty"),
    ({"input": [[]]}, "input", "empty"),
    ({}, "input", "Missing required field 'input'"),
    ({"input": "a", "dimensions": "4"}, "dimensions", None),
    ({"input": "a", "dimensions": 385}, "dimensions", "larger than the model's"),
    ({"input": "a", "dimensions": 0}, "dimensions", "positive"),
    ({"input": "a", "encoding_format": "base65"}, "encoding_format", None),
    ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", None),
    ({"input": "a", "prompt_name": "query"}, None, "prompt_name"),
])
def test_invalid_embeddings_requests(client, body, param, contains):
    assert_error(client.post("/v1/embeddings", json=body), 400, param, contains)


@pytest.mark.parametrize("route,body,contains", [
    ("/v1/embeddings", {"input": "a", "dimensions": 385}, "embedding size 384; use a value <="),
    ("/pooling", {"input": "a", "dimensions": 385}, "embedding size 384"),
    ("/pooling", {"input": "a", "task": "token_embed", "dimensions": 385},
     "token embedding size 384"),
    ("/pooling", {"input": "a", "task": "token_embed", "dimensions": -2}, "positive"),
])
def test_dimensions_rejected_by_the_engine_reported_as_the_field(client, route, body, contains):
    """The engine's verify_params decides; every route answers 400 naming `dimensions`."""
    assert_error(client.post(route, json=body), 400, "dimensions", contains)


def test_unknown_model_bad_token_ids_and_overlong(client):
    assert_error(client.post("/pooling", json={"input": "a", "model": "gpt-4"}),
                 404, "model", "does not exist")
    assert_error(client.post("/v1/embeddings", json={"input": [[101, -1, 102]]}), 400,
                 None, "outside the vocabulary")
    assert_error(client.post("/v1/embeddings", json={"input": [10**9]}), 400,
                 None, "outside the vocabulary")
    long_text = "word " * 400
    assert_error(client.post("/v1/embeddings", json={"input": long_text, "truncate": False}),
                 400, None, "Please reduce the length of the input prompt")  # vLLM's words
    # TEI's routes answer in TEI's shape (tests/server/test_tei_api.py): auto-truncate by
    # default, truncate=false -> 422.
    assert client.post("/embed", json={"inputs": long_text}).status_code == 200
    r = client.post("/embed", json={"inputs": long_text, "truncate": False})
    assert r.status_code == 422 and "more than the maximum" in r.json()["error"]
    assert_error(client.post("/detokenize", json={"tokens": [999999]}), 400, "tokens")
    r = client.post("/decode", json={"ids": [-3]})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"


def test_unsupported_task_and_malformed_bodies(client):
    assert_error(client.post("/pooling", json={"input": "a", "task": "token_classify"}), 400,
                 "task", "does not support")
    assert_error(client.post("/pooling", json={"input": "a", "task": "nonsense"}), 400, "task")
    assert_error(client.post("/v1/embeddings", content=b"{not json",
                             headers={"content-type": "application/json"}), 400, None,
                 "not valid JSON")
    assert_error(client.post("/v1/embeddings", json=["a", "b"]), 400)
    assert_error(client.post("/rerank", json={"query": "q"}), 400, "documents")
    r = client.post("/rerank", json={"query": "q", "texts": "not a list"})  # TEI's body
    assert r.status_code == 422 and "texts" in r.json()["error"], r.text
    assert_error(client.post("/tokenize", json={"prompt": 3}), 400, "prompt")
    assert_error(client.get("/v1/embeddings"), 405)
    assert_error(client.post("/no/such/route", json={}), 404)


def test_limits_give_413_and_503(engine, serve_app):
    settings = ServerSettings(max_input_items=4, max_payload_bytes=2000, max_queue=6)
    with serve_app(engine, settings) as (url, app), httpx.Client(base_url=url) as c:
        assert c.post("/v1/embeddings", json={"input": ["a"] * 4}).status_code == 200
        assert_error(c.post("/v1/embeddings", json={"input": ["a"] * 5}), 413, "input",
                     "--max-input-items")
        assert_error(c.post("/v1/embeddings", json={"input": "x" * 3000}), 413, None,
                     "--max-payload-bytes")
        # A chunked body without Content-Length is counted as it streams.
        chunks = (b'{"input": "' + b"y" * 1500, b"y" * 1500 + b'"}')
        r = c.post("/v1/embeddings", content=iter(chunks),
                   headers={"content-type": "application/json"})
        assert_error(r, 413, None, "--max-payload-bytes")
        admission = app.state.pooler.admission
        admission.in_flight += 5  # as if other clients had 5 inputs queued
        try:
            r = c.post("/v1/embeddings", json={"input": ["a", "b"]})
            assert_error(r, 503, None, "--max-queue")
            assert r.headers["retry-after"] == "1"
            assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 200
        finally:
            admission.in_flight -= 5
        assert admission.in_flight == 0


def test_api_key(engine, serve_app):
    openai = pytest.importorskip("openai")
    with serve_app(engine, ServerSettings(api_key="s3cret")) as (url, app):
        with httpx.Client(base_url=url) as c:
            assert c.get("/health").status_code == 200
            for path in ("/v1/models", "/metrics", "/info", "/openapi.json"):
                assert_error(c.get(path), 401, None, "Missing API key")
            assert_error(c.get("/v1/models", headers={"authorization": "Bearer wrong"}), 401,
                         None, "Invalid API key")
            assert_error(c.get("/v1/models", headers={"authorization": "s3cret"}), 401)
            assert c.get("/v1/models",
                         headers={"authorization": "Bearer s3cret"}).status_code == 200
        ok = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret")
        assert len(ok.embeddings.create(model=app.state.pooler.model_name, input="a").data) == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="nope").models.list()


def test_401_body_takes_the_route_protocol_shape(engine, serve_app):
    """Every 401 is compact JSON in the shape its route's other errors have: vLLM's (`code` the
    HTTP status as an integer), TEI's {"error", "error_type"}, Cohere's {"message"}, OpenAI's."""
    with serve_app(engine, ServerSettings(api_key="s3cret")) as (url, app):
        with httpx.Client(base_url=url) as c:
            vllm = c.post("/pooling", json={"input": "a"})
            assert vllm.status_code == 401 and vllm.headers["www-authenticate"] == "Bearer"
            assert vllm.json() == {"error": {"message": "Missing API key: send 'Authorization: "
                                                        "Bearer <key>'.",
                                             "type": "UnauthorizedError", "param": None,
                                             "code": 401}}
            tei = c.post("/embed", json={"inputs": "a"}, headers={"authorization": "Bearer x"})
            assert tei.status_code == 401
            assert tei.json() == {"error": "Invalid API key.", "error_type": "Unauthorized"}
            cohere = c.post("/v2/embed", json={"texts": ["a"], "input_type": "search_query"})
            assert cohere.status_code == 401 and set(cohere.json()) == {"message"}
            # /v1/embeddings answers vLLM's error shape (as vLLM's server does)
            assert assert_error(c.post("/v1/embeddings", json={"input": "a"}), 401)["code"] == 401
            assert assert_error(c.get("/v1/models"), 401)["code"] == "invalid_api_key"
            for r in (vllm, tei, cohere):
                assert b"\n" not in r.content  # one line, as every other error body
