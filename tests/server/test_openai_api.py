"""The real `openai` client against the server: results equal the offline API exactly."""
from __future__ import annotations

import base64

import numpy as np
import pytest

openai = pytest.importorskip("openai")

def as_array(data) -> np.ndarray:
    """The client decodes base64 itself only when it chose the format; else we do."""
    rows = [np.frombuffer(base64.b64decode(d.embedding), "<f4") if isinstance(d.embedding, str)
            else np.array(d.embedding, np.float32) for d in data]
    return np.stack(rows)


# No empty string: OpenAI and vLLM refuse one (test_drop_in_residue.py).
TEXTS = ["pooler serves embedding models", "The cat sat on the mat.", "東京 🙂",
         "a much longer sentence " * 20]


@pytest.fixture(scope="module")
def oa(url, server):
    app = server[1]
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), app.state.pooler.model_name


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
def test_embeddings_match_offline_exactly(oa, engine, encoding_format):
    client, name = oa
    kwargs = {} if encoding_format is None else {"encoding_format": encoding_format}
    response = client.embeddings.create(model=name, input=TEXTS, **kwargs)
    expected = engine.embed(TEXTS, use_tqdm=False)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    got = as_array(response.data)
    np.testing.assert_array_equal(got, np.stack([e.embedding for e in expected]))
    assert response.usage.prompt_tokens == sum(e.num_tokens for e in expected)
    assert response.model == name


def test_single_string_token_ids_and_dimensions(oa, engine):
    client, name = oa
    one = client.embeddings.create(model=name, input="hello world", encoding_format="float")
    np.testing.assert_array_equal(np.array(one.data[0].embedding, np.float32),
                                  engine.embed("hello world")[0].embedding)
    ids = [[101, 7592, 2088, 102], [101, 2088, 102]]
    by_ids = client.embeddings.create(model=name, input=ids, encoding_format="float")
    expected = engine.embed(ids)
    for d, e in zip(by_ids.data, expected):
        np.testing.assert_array_equal(np.array(d.embedding, np.float32), e.embedding)
    small = client.embeddings.create(model=name, input="hello", dimensions=64,
                                     encoding_format="float")
    vec = np.array(small.data[0].embedding, np.float32)
    assert vec.shape == (64,)
    np.testing.assert_array_equal(vec, engine.embed("hello", dimensions=64)[0].embedding)


def test_models_list(oa):
    client, name = oa
    models = client.models.list()
    assert [m.id for m in models.data] == [name]


def test_any_model_name_is_served(oa, engine):
    """As on TEI's /v1/embeddings: a client set up with another name works (the single
    model answers and names itself); the vLLM-only routes answer 404 (test_errors.py)."""
    client, name = oa
    response = client.embeddings.create(model="no-such-model", input="x")
    assert response.model == name


def test_thousand_inputs_in_one_request(oa, engine):
    client, name = oa
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(1000)]
    response = client.embeddings.create(model=name, input=texts, encoding_format="base64")
    assert len(response.data) == 1000
    got = as_array(response.data)
    expected = np.stack([e.embedding for e in engine.embed(texts, use_tqdm=False)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
