"""Spec and server agree (issue 28, part 4): what the fuzzer found, pinned as requests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def spec(client):
    return client.get("/openapi.json").json()


def _body_schema(spec, path):
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


@pytest.mark.parametrize("overlap", [-1, 10**6])
def test_embed_chunks_window_overlap_is_named(client, spec, overlap):
    r = client.post("/embed_chunks", json={"document": "One. Two.", "window_overlap": overlap})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "window_overlap" and "window_overlap" in error["message"]
    assert "chunk_overlap" not in error["message"]
    # The spec says which values are taken: both refused ones lie outside it.
    prop = _body_schema(spec, "/embed_chunks")["properties"]["window_overlap"]
    integer = next(o for o in prop["anyOf"] if o.get("type") == "integer")
    assert integer["minimum"] == 0 and integer["maximum"] < 10**6
    r = client.post("/embed_chunks", json={"document": "One. Two.",
                                           "window_overlap": integer["maximum"]})
    assert r.status_code == 200, r.text


def test_optional_fields_take_null_in_spec_and_server(client, spec):
    props = _body_schema(spec, "/v1/embeddings")["properties"]
    for name in ("encoding_format", "dimensions", "truncate"):
        assert any(o.get("type") == "null" for o in props[name].get("anyOf", [])), name
    r = client.post("/v1/embeddings", json={"input": "a", "encoding_format": None,
                                            "truncate": None})
    assert r.status_code == 200, r.text
    # A required field does not take null, in the spec or the server.
    rerank = _body_schema(spec, "/v1/rerank")
    assert "query" in rerank["required"]
    assert not any(o.get("type") == "null"
                   for o in rerank["properties"]["query"].get("anyOf", []))


def test_empty_input_text_is_outside_the_spec(spec):
    """vLLM refuses an empty prompt (400): the spec's input strings are non-empty."""
    props = _body_schema(spec, "/v1/embeddings")["properties"]["input"]
    strings = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "string":
                strings.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(props)
    assert strings and all(s.get("minLength") == 1 for s in strings)


@pytest.mark.parametrize("route,body,param", [
    ("/detokenize", {"tokens": []}, "tokens"),
    ("/tokenize", {"prompt": "a", "priority": 1}, "priority"),
    ("/rerank", {"query": "q", "documents": ["a b c"], "max_tokens_per_doc": 1},
     "max_tokens_per_doc"),
    ("/v2/embed", {"texts": ["a b c"], "max_tokens": 1}, "max_tokens"),
    ("/v1/score", {"data_1": "a", "data_2": "b", "text_2": []}, "text_2"),
])
def test_schema_violating_requests_are_refused(client, route, body, param):
    """Found by negative_data_rejection on the embedder: each now a 400 naming the field."""
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    payload = r.json()
    if "error" in payload:
        assert payload["error"]["param"] == param
    else:  # Cohere's {"message"}
        assert param in payload["message"]


def test_decode_refuses_an_empty_id_list(client):
    r = client.post("/decode", json={"ids": [[101], []]})
    assert r.status_code == 400 and r.json()["error_type"] == "Empty"


def test_integral_float_dimensions_on_embed_chunks(client):
    r = client.post("/embed_chunks", json={"document": "One. Two.", "dimensions": 64.0})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) == 64


def test_root_spec_takes_token_ids_on_an_embedder(client, spec):
    r = client.post("/", json={"inputs": [101, 7592, 102]})
    assert r.status_code == 200, r.text
    options = spec["paths"]["/"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["properties"]["inputs"]["anyOf"]
    assert any(o.get("type") == "array" and o["items"].get("type") == "integer"
               for o in options)


@pytest.mark.parametrize("route,body,param", [
    ("/rerank", {"query": "q", "documents": ["a b c"], "truncate_prompt_tokens": 1},
     "truncate_prompt_tokens"),
    ("/v1/embed", {"texts": ["a"], "inputs": []}, "inputs"),
])
def test_more_schema_violating_requests_are_refused(client, route, body, param):
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    payload = r.json()
    assert (payload["error"]["param"] if "error" in payload else payload["message"]) and \
        param in (payload["error"]["param"] if "error" in payload else payload["message"])


# ---- the long run's second seed (4321): both ways, each case checked against the spec itself
def _spec_takes(spec, route, body) -> bool:
    """Whether `body` is valid for POST `route` under the served spec (JSON Schema 2020-12,
    refs resolved against the whole document, as schemathesis reads it)."""
    import jsonschema

    schema = spec["paths"][route]["post"]["requestBody"]["content"]["application/json"][
        "schema"]
    root = {**schema, "components": spec.get("components", {})}
    return jsonschema.Draft202012Validator(root).is_valid(body)


def _param(payload) -> str:
    return payload["error"]["param"] if "error" in payload else payload["message"]


@pytest.mark.parametrize("route,body", [
    # A query side whose pair is not given is not scored: any list of texts is taken there.
    ("/v1/score", {"data_1": "a", "data_2": "b", "text_1": ["a", "b"]}),
    ("/score", {"data_1": "a", "data_2": "b", "text_1": ["a", "b"], "text_2": None}),
    # add_special_tokens false with a text that has tokens of its own (vLLM takes it).
    ("/v1/embeddings", {"input": "0", "add_special_tokens": False}),
    ("/pooling", {"input": ["a b", "0"], "add_special_tokens": False}),
    # Cut to the special tokens alone: the tokenizer can, as vLLM's does.
    ("/v1/embeddings", {"input": "0", "truncate_prompt_tokens": 2}),
    ("/invocations", {"input": "0", "truncate_prompt_tokens": 2}),
    # The tokenizer routes take the truncation fields and ignore them.
    ("/tokenize", {"prompt": "a b", "truncate_prompt_tokens": 0}),
    ("/detokenize", {"tokens": [101], "truncate_prompt_tokens": 0}),
    # normalize and use_activation (or activation) are one switch: given together, they agree.
    ("/v1/embeddings", {"input": "a", "normalize": True, "activation": True}),
])
def test_spec_takes_what_the_server_serves(client, spec, route, body):
    assert _spec_takes(spec, route, body)
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route,body,param", [
    # N queries need N texts on the other side, in every spelling given (scored or not).
    ("/v1/score", {"data_1": "a", "data_2": "b", "text_1": ["a", "b"], "text_2": "c"},
     "text_2"),
    ("/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "documents"),
    # Cohere takes texts or inputs, not both (an input without text among them, too).
    ("/v1/embed", {"texts": [""], "inputs": [{"content": [{"type": "text"}]}]}, "inputs"),
    ("/v2/embed", {"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]},
     "inputs"),
    # A blank text without special tokens has no tokens at all.
    ("/v1/embeddings", {"input": " ", "add_special_tokens": False}, None),
    # long_input chunk puts the special tokens around every window (seed 4321, third pass).
    ("/v1/embeddings", {"input": "a b", "add_special_tokens": False, "long_input": "chunk"},
     "add_special_tokens"),
    # Fewer tokens than the special tokens.
    ("/v1/embeddings", {"input": "0", "truncate_prompt_tokens": 1}, "truncate_prompt_tokens"),
    ("/v1/embeddings", {"input": "a", "normalize": True, "activation": False}, "normalize"),
    ("/embed_chunks", {"document": " \n "}, "document"),
])
def test_server_refuses_what_the_spec_forbids(client, spec, route, body, param):
    assert not _spec_takes(spec, route, body)
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    if param is not None:
        assert param in _param(r.json()), r.text


def test_n_to_n_scores_are_served_and_described(client, spec):
    """N x N pairs are served (vLLM); JSON Schema cannot tie the two lengths, so the spec
    shows the one-query form and the query side's description states the rule."""
    r = client.post("/v1/score", json={"text_1": ["a", "b"], "text_2": ["c", "d"]})
    assert r.status_code == 200, r.text
    assert [d["index"] for d in r.json()["data"]] == [0, 1]
    props = _body_schema(spec, "/v1/score")["properties"]
    for side in ("queries", "data_1", "text_1"):
        assert "N queries" in props[side]["description"], side


@pytest.mark.parametrize("document,texts", [
    ("\u008d", []),  # seed 1234: one control character (no token) was a 400 from numpy
    ("Hello there. \u008d", ["Hello there."]),
])
def test_embed_chunks_leaves_out_sentences_without_a_token(client, spec, document, texts):
    body = {"document": document}
    assert _spec_takes(spec, "/embed_chunks", body)
    r = client.post("/embed_chunks", json=body)
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["data"]] == texts
    assert r.json()["usage"]["prompt_tokens"] >= 2  # the special tokens at least


def test_chunking_servers_spec_needs_special_tokens(server):
    """On a server started with --long-input chunk an unset long_input chunks, which needs
    the special tokens: its spec takes add_special_tokens false only beside long_input
    "truncate"."""
    from pooler.server.app import create_app
    from pooler.server.settings import ServerSettings

    engine = server[1].state.pooler.engine
    spec = create_app(engine, ServerSettings(long_input="chunk")).openapi()
    assert not _spec_takes(spec, "/v1/embeddings", {"input": "a", "add_special_tokens": False})
    assert _spec_takes(spec, "/v1/embeddings", {"input": "a", "add_special_tokens": False,
                                                "long_input": "truncate"})


def test_classifier_root_body_is_predicts(cross_encoder_server):
    """POST / on a classifier is TEI's /predict: a text, [text] or [text, pair], or a batch of
    those lists; a flat list of more than two texts is a 422 there and outside the spec."""
    import httpx

    url = cross_encoder_server[0]
    spec = httpx.get(f"{url}/openapi.json").json()
    for body, status in (({"inputs": ["a", "b", "c"]}, 422),
                         ({"inputs": [["a"], ["b", "c"]]}, 200),
                         ({"inputs": ["a", "b"]}, 200)):
        assert _spec_takes(spec, "/", body) == (status == 200), body
        assert httpx.post(f"{url}/", json=body, timeout=60).status_code == status, body


def test_cohere_truncate_none_refuses_a_text_past_max_tokens(client, spec):
    """A rule JSON Schema cannot state (a text's token count): described in the spec, a 400
    from the server, and kept out of the fuzzer's bodies by its documented filter_body hook."""
    body = {"texts": ["one two three four"], "truncate": "NONE", "max_tokens": 3}
    r = client.post("/v2/embed", json=body)
    assert r.status_code == 400, r.text
    props = _body_schema(spec, "/v2/embed")["properties"]
    assert "NONE" in props["max_tokens"]["description"]
    from tests.server import schemathesis_hooks

    assert not schemathesis_hooks.filter_body(None, body)
    assert schemathesis_hooks.filter_body(None, {**body, "texts": ["a"]})
    assert schemathesis_hooks.filter_body(None, {**body, "truncate": "END"})


def test_root_get_is_declared_as_served(client, spec):
    """Issue 43 item 6: GET / (TEI's Inference API health check) answered 200 while the spec
    declared only POST /; now the spec declares what the server answers, and a method it
    declares nowhere is a 405."""
    r = client.get("/")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    root = spec["paths"]["/"]
    assert set(root) == {"get", "post"}
    assert "200" in root["get"]["responses"] and "503" in root["get"]["responses"]
    assert client.put("/", json={}).status_code == 405


def test_root_health_stays_declared_where_post_root_is_not_served(monkeypatch):
    """A model that POST / does not serve (GLiNER: labels only on /ner) keeps GET /."""
    from pooler.server import openapi_spec

    spec = {"paths": {"/": {"get": {"responses": {"200": {}}}, "post": {}},
                      "/v1/embeddings": {"post": {}}, "/health": {"get": {}}}}
    monkeypatch.setattr(openapi_spec, "ROUTE_NEEDS",
                        {"/": lambda e: False, "/v1/embeddings": lambda e: False})
    openapi_spec.drop_unserved_paths(spec, engine=None)
    assert spec["paths"] == {"/": {"get": {"responses": {"200": {}}}}, "/health": {"get": {}}}


def test_jina_task_takes_only_null_on_a_model_without_task_adapters(client, spec):
    task = _body_schema(spec, "/v1/embeddings")["properties"]["task"]
    assert task["anyOf"] == [{"type": "null"}]
    r = client.post("/v1/embeddings", json={"input": "a", "task": "retrieval.query"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task"
    assert "carries no task adapters" in r.json()["error"]["message"]
