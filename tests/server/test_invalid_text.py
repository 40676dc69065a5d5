"""No input text causes a 500 (issue 18, item 3).

A lone UTF-16 surrogate (JSON "\\ud800" escape) in any text field of any route is a 400 naming
the field; every other text reaches a 2xx or a 4xx. The property test draws texts from all of
Unicode including lone surrogates, control characters and non-characters, puts them in the
text fields of every route, and runs against an embedding model and a cross-encoder (so the
pair, rerank and classify paths really tokenize). Fixed seed (derandomize), bounded examples.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pooler.server.edges.invalid_text import lone_surrogate_error

SPECIAL = ["", " ", "\x00", "\ud800", "\udfff", "a\ud800b", "\ud83d\ude00", "\ud83d",
           "\ufeff", "\uffff", "\U0010ffff", "\u200b", "\r\n", "\\ud800", "[SEP]", "[CLS] x",
           "e\u0301", "\u202e"]
CHARS = st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]),
                  st.sampled_from(["\x00", "\ud800", "\udc00", "\ufffe", "\U0001f600"]))
TEXT = st.one_of(st.text(CHARS, max_size=40), st.sampled_from(SPECIAL))

# Every POST route that takes text, with its text fields filled from (a, b).
ROUTES = [
    ("/v1/embeddings", lambda a, b: {"input": a}),
    ("/v1/embeddings", lambda a, b: {"input": [a, b], "user": b}),
    ("/embed", lambda a, b: {"inputs": [a, b], "truncate": True}),
    ("/embed_all", lambda a, b: {"inputs": a, "truncate": True}),
    ("/pooling", lambda a, b: {"input": [a, b]}),
    ("/classify", lambda a, b: {"input": a}),
    ("/score", lambda a, b: {"text_1": a, "text_2": [b, a]}),
    ("/v1/score", lambda a, b: {"queries": [a], "documents": [b]}),
    ("/rerank", lambda a, b: {"query": a, "documents": [b, {"text": a}]}),
    ("/rerank", lambda a, b: {"query": a, "texts": [b], "truncate": True,
                              "truncation_direction": "Left"}),
    ("/v1/rerank", lambda a, b: {"query": a, "documents": [b], "return_documents": True}),
    ("/v2/rerank", lambda a, b: {"query": b, "documents": [a, b], "top_n": 1}),
    ("/tokenize", lambda a, b: {"prompt": a, "return_token_strs": True}),
    ("/tokenize", lambda a, b: {"inputs": [a, b]}),
    ("/predict", lambda a, b: {"inputs": [a, b]}),
    ("/predict", lambda a, b: {"inputs": [[a, b]], "truncate": True}),
    ("/embed_sparse", lambda a, b: {"inputs": a}),
    ("/ner", lambda a, b: {"input": a}),
    ("/detokenize", lambda a, b: {"tokens": [101, 102], "model": a}),
    ("/v1/embeddings", lambda a, b: {"input": "x", "prompt_name": a}),
]


def _has_lone_surrogate(body) -> bool:
    return lone_surrogate_error(json.dumps(body).encode()) is not None


@pytest.fixture(scope="module")
def cross_encoder_url(cross_encoder_server):
    return cross_encoder_server[0]


def _check(client: httpx.Client, path: str, body: dict) -> None:
    r = client.post(path, content=json.dumps(body),  # ensure_ascii: "\ud800" escapes
                    headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, body, r.status_code, r.text)
    if _has_lone_surrogate(body):
        error = r.json()["error"]
        assert r.status_code == 400, (path, body, r.text)
        assert error["code"] == "invalid_text"
        assert error["param"] in body, error
        assert "surrogate" in error["message"]


@settings(max_examples=120, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), a=TEXT, b=TEXT)
def test_any_text_on_any_route_is_2xx_or_4xx(client, route, a, b):
    path, make = route
    _check(client, path, make(a, b))


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), a=TEXT, b=TEXT)
def test_any_text_on_a_cross_encoder_is_2xx_or_4xx(cross_encoder_url, route, a, b):
    with httpx.Client(base_url=cross_encoder_url, timeout=60) as client:
        path, make = route
        _check(client, path, make(a, b))


@pytest.mark.parametrize("path, body, field", [
    ("/v1/embeddings", {"input": "a\ud800b"}, "input"),
    ("/embed", {"inputs": ["ok", "a\ud800b"]}, "inputs"),
    ("/pooling", {"input": "a\ud800b"}, "input"),
    ("/tokenize", {"prompt": "a\ud800b"}, "prompt"),
    ("/rerank", {"query": "q", "documents": ["a\ud800b"]}, "documents"),
    ("/v1/rerank", {"query": "a\ud800b", "documents": ["d"]}, "query"),
    ("/score", {"text_1": "q", "text_2": "a\udc00"}, "text_2"),
])
def test_the_issue_examples_are_400_naming_the_field(client, path, body, field):
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field
    assert error["code"] == "invalid_text"


def test_surrogate_pairs_are_valid_text(client):
    """json.dumps escapes an emoji as a surrogate pair: that is valid and embeds."""
    body = json.dumps({"input": "smile \U0001f600"})
    assert "\\ud83d\\ude00" in body
    r = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [b'{"input": "a\xed\xa0\x80b"}',  # a surrogate as UTF-8
                                 b'{"input": "a\xffb"}', b'{"input": "a\xc3"}'])
def test_invalid_utf8_bytes_are_a_400(client, raw):
    r = client.post("/v1/embeddings", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
