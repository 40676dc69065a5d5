"""vLLM's /pooling entrypoint tests (tests/entrypoints/pooling/pooling/test_online.py, run there
on a per-token reward model), translated to a tiny seeded one-label token classifier with a chat
template: per-token outputs, usage, float / base64 / bytes / bytes_only encodings of every
embed_dtype and endianness, bad encoding values, chat input and /invocations dispatch."""
from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from pooler import Engine
from tests.server import vllm_schema as vs

TEXT = "The chef prepared a delicious meal."
TEMPLATE = "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "The cat sat on the mat."},
            {"role": "assistant", "content": "A feline was resting on a rug."}]


@pytest.fixture(scope="module")
def reward(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("reward"), minilm_path,
                        "BertForTokenClassification", 1)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config,
                                                              "chat_template": TEMPLATE}))
    engine = Engine(str(folder))
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine


@pytest.fixture(scope="module")
def ids(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path)).encode(TEXT)


def _pool(client, **body) -> vs.PoolingResponse:
    r = client.post("/pooling", json=body)
    assert r.status_code == 200, r.text
    return vs.PoolingResponse.model_validate(r.json())


def test_per_token_outputs_and_usage(reward, ids):
    client, engine = reward
    expected = engine.token_classify([TEXT])[0].probs  # [num_tokens, 1]
    for inputs, n in ((TEXT, 1), (ids, 1), ([TEXT] * 4, 4), ([ids] * 4, 4)):
        body = _pool(client, input=inputs, encoding_format="float")
        assert body.id.startswith("pool-") and len(body.data) == n
        assert np.shape(body.data[0].data) == (len(ids), 1)
        assert body.usage.completion_tokens == 0
        assert body.usage.prompt_tokens == body.usage.total_tokens == len(ids) * n
        np.testing.assert_allclose(body.data[-1].data, expected, atol=1e-6)


def test_chat_equals_the_rendered_prompt(reward):
    client, _ = reward
    chat = _pool(client, messages=MESSAGES)
    prompt = "".join(f"{m['role']}: {m['content']}\n" for m in MESSAGES)
    completion = _pool(client, input=prompt, add_special_tokens=False)
    assert chat.created <= completion.created
    assert (chat.model_dump(exclude={"id", "created"})
            == completion.model_dump(exclude={"id", "created"}))


def test_base64_default_and_every_dtype(reward):
    client, _ = reward
    texts = ["Hello my name is", "The best thing about vLLM is that it supports many models"]
    floats = [np.asarray(d.data).reshape(-1) for d in _pool(client, input=texts).data]
    b64 = _pool(client, input=texts, encoding_format="base64")
    for d, f in zip(b64.data, floats):
        np.testing.assert_array_equal(np.frombuffer(base64.b64decode(d.data), "float32"), f)
    for embed_dtype in vs.EMBED_DTYPES:
        tol = {"float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}.get(embed_dtype, 1e-1)
        for endianness in vs.ENDIANNESS:
            body = _pool(client, input=texts, encoding_format="base64",
                         embed_dtype=embed_dtype, endianness=endianness)
            for d, f in zip(body.data, floats):
                np.testing.assert_allclose(vs.decode_base64(d.data, embed_dtype, endianness),
                                           f, atol=tol)


def test_bytes_and_bytes_only(reward, ids):
    client, _ = reward
    texts = [TEXT] * 3
    floats = [np.asarray(d.data) for d in _pool(client, input=texts).data]
    for embed_dtype in vs.EMBED_DTYPES:
        tol = {"float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}.get(embed_dtype, 1e-1)
        for endianness in vs.ENDIANNESS:
            args = {"input": texts, "embed_dtype": embed_dtype, "endianness": endianness}
            r = client.post("/pooling", json={**args, "encoding_format": "bytes"})
            meta, items = vs.metadata_of(r)
            assert meta["usage"]["prompt_tokens"] == 3 * len(ids)
            assert all(i.shape == [len(ids), 1] for i in items)
            for got, f in zip(vs.decode_bytes_body(r.content, items), floats):
                np.testing.assert_allclose(got, f, atol=tol)
            r = client.post("/pooling", json={**args, "encoding_format": "bytes_only"})
            assert "metadata" not in r.headers
            size = len(r.content) // 3
            for i, f in enumerate(floats):
                got = vs.decode_binary(r.content[i * size:(i + 1) * size], (len(ids), 1),
                                       embed_dtype, endianness)
                np.testing.assert_allclose(got, f, atol=tol)


@pytest.mark.parametrize("param", ["encoding_format", "embed_dtype", "endianness"])
def test_bad_encoding_values(reward, param):
    client, _ = reward
    r = client.post("/pooling", json={"input": TEXT, "encoding_format": "base64",
                                      param: f"bad_{param}"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "literal_error" in message and f"bad_{param}" in message


def test_invocations_go_to_pooling(reward):
    client, _ = reward
    for args in ({"input": TEXT, "encoding_format": "float"}, {"messages": MESSAGES}):
        direct = client.post("/pooling", json=args).json()
        invoked = client.post("/invocations", json=args).json()
        assert direct.keys() == invoked.keys()
        for a, b in zip(direct["data"], invoked["data"]):
            assert a.keys() == b.keys()
            np.testing.assert_allclose(a["data"], b["data"], atol=1e-6)
