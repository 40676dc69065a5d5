"""Quantized vectors on the server (issue 16): `precision` on /v1/embeddings and /embed, with
fixed default ranges ([-1, 1] per dimension) so a text's codes never depend on its batch."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from pooler.quantize_output import quantize_embeddings

TEXTS = ["hello world", "quantized vectors", "a third text"]
DEFAULT_RANGES = np.vstack([-np.ones(384), np.ones(384)]).astype(np.float32)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_v1_embeddings_and_embed_precision(client, engine, precision):
    floats = np.stack([o.embedding for o in engine.embed(TEXTS)])
    want = quantize_embeddings(floats, precision, ranges=DEFAULT_RANGES)
    r = client.post("/v1/embeddings", json={"input": TEXTS, "precision": precision})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    assert got.shape == want.shape and np.abs(got - want.astype(int)).max() <= 1
    r = client.post("/v1/embeddings", json={"input": TEXTS, "precision": precision,
                                            "encoding_format": "base64"})
    raw = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), want.dtype)
                    for d in r.json()["data"]])
    assert np.abs(raw.astype(int) - want.astype(int)).max() <= 1
    r = client.post("/embed", json={"inputs": TEXTS, "precision": precision})
    assert r.status_code == 200, r.text
    assert np.abs(np.array(r.json()) - want.astype(int)).max() <= 1


def test_codes_do_not_depend_on_the_batch(client):
    alone = client.post("/embed", json={"inputs": ["hello world"], "precision": "int8"}).json()
    batched = client.post("/embed", json={"inputs": TEXTS, "precision": "int8"}).json()
    assert alone[0] == batched[0]


def test_ranges_and_bad_values(client, engine):
    floats = np.stack([o.embedding for o in engine.embed(TEXTS)])
    ranges = np.vstack([floats.min(0) - 0.01, floats.max(0) + 0.01])
    r = client.post("/v1/embeddings", json={"input": TEXTS, "precision": "uint8",
                                            "ranges": ranges.tolist()})
    got = np.array([d["embedding"] for d in r.json()["data"]])
    want = quantize_embeddings(floats, "uint8", ranges=ranges.astype(np.float32))
    assert np.abs(got - want.astype(int)).max() <= 1
    r = client.post("/v1/embeddings", json={"input": "a", "precision": "int4"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "precision"
    r = client.post("/v1/embeddings", json={"input": "a", "precision": "int8",
                                            "ranges": [[0.0], [1.0]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ranges"
    r = client.post("/embed", json={"inputs": "a", "precision": "int8", "ranges": [[0.0]]})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"


@pytest.mark.parametrize("precision", ["int8", "ubinary"])
def test_pooling_route_precision(client, engine, precision):
    """/pooling takes `precision` for vectors: embed (one per input) and token_embed (one per
    token, each row quantized with the same ranges)."""
    floats = np.stack([o.embedding for o in engine.embed(TEXTS)])
    want = quantize_embeddings(floats, precision, ranges=DEFAULT_RANGES)
    r = client.post("/pooling", json={"input": TEXTS, "task": "embed", "precision": precision})
    assert r.status_code == 200, r.text
    got = np.array([d["data"] for d in r.json()["data"]])
    assert got.shape == want.shape and np.abs(got - want.astype(int)).max() <= 1

    tokens = engine.token_embed(TEXTS[1])[0].embeddings  # [num_tokens, 384]
    want = quantize_embeddings(np.asarray(tokens, np.float32), precision,
                               ranges=DEFAULT_RANGES)
    r = client.post("/pooling", json={"input": TEXTS[1], "task": "token_embed",
                                      "precision": precision, "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["data"]), want.dtype)
    assert np.abs(raw.reshape(want.shape).astype(int) - want.astype(int)).max() <= 1


def test_pooling_route_precision_errors(client):
    r = client.post("/pooling", json={"input": "a", "task": "embed", "precision": "int8",
                                      "encoding_format": "bytes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"
    r = client.post("/pooling", json={"input": "a", "task": "embed", "precision": "uint8",
                                      "ranges": [[0.0], [1.0]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ranges"
    # token_embed's size is only known from its output: a bad ranges is still a 400.
    r = client.post("/pooling", json={"input": "a", "task": "token_embed", "precision": "int8",
                                      "ranges": [[0.0], [1.0]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ranges"
