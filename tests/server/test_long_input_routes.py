"""The server side of long inputs: /embed_chunks (late chunking) and long_input on
/v1/embeddings, answered as the offline Engine answers."""
from __future__ import annotations

import numpy as np

LONG = "The quick brown fox jumps over the lazy dog. " * 60  # ~600 tokens, max is 256
DOC = ("Berlin is the capital of Germany. It has about 3.8 million inhabitants. "
       "The city is known for its museums.")


def test_embed_chunks_route_matches_the_engine(client, engine):
    r = client.post("/embed_chunks", json={"document": DOC})
    assert r.status_code == 200, r.text
    body = r.json()
    want = engine.embed_chunks(DOC)
    assert [(d["start"], d["end"], d["text"]) for d in body["data"]] == \
        [(c.start, c.end, c.text) for c in want]
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]),
                               np.stack([c.embedding for c in want]), atol=1e-6)
    # usage counts the document's tokens once (special tokens included), even past max length
    for doc in (DOC, LONG):
        r = client.post("/embed_chunks", json={"document": doc})
        tokens = len(engine.tokenizer.encode_batch([doc])[0].input_ids)
        assert r.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    r = client.post("/embed_chunks", json={"document": DOC, "chunks": [[0, 6]]})
    assert r.status_code == 200 and r.json()["data"][0]["text"] == "Berlin"


def test_embed_chunks_bad_spans_are_400(client):
    r = client.post("/embed_chunks", json={"document": DOC, "chunks": [[5, 5000]]})
    assert r.status_code == 400, r.text
    assert "chunks[0]" in r.json()["error"]["message"]


def test_long_input_chunk_on_v1_embeddings(client, engine):
    r = client.post("/v1/embeddings", json={"input": [LONG, "short"], "long_input": "chunk"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    want = np.stack([o.embedding for o in engine.embed([LONG, "short"], long_input="chunk")])
    np.testing.assert_allclose(got, want, atol=1e-6)
    truncated = client.post("/v1/embeddings", json={"input": LONG}).json()["data"][0]
    assert not np.allclose(truncated["embedding"], got[0], atol=1e-4)  # the default truncates
    r = client.post("/v1/embeddings", json={"input": LONG, "long_input": "split"})
    assert r.status_code == 400
