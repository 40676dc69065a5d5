"""vLLM's embedding, pooling and tokenizer entrypoint tests (tests/entrypoints/pooling/embed/
test_online.py, tests/entrypoints/openai/test_tokenization.py), translated to pooler's server
with all-MiniLM-L6-v2, every response validated against vLLM's protocol (vllm_schema.py) and
compared with the offline Engine."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.server import vllm_schema as vs

TEXT = "The best thing about vLLM is that it supports many different models"


@pytest.fixture(scope="module")
def model_name(client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def hf_tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


def _embed(client, **body) -> vs.EmbeddingResponse:
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    return vs.EmbeddingResponse.model_validate(r.json())


def test_tokenize_matches_the_reference_tokenizer(client, model_name, hf_tokenizer, engine):
    for add_special in (False, True):
        r = client.post("/tokenize", json={"model": model_name, "prompt": TEXT,
                                           "add_special_tokens": add_special})
        body = vs.TokenizeResponse.model_validate(r.json())
        expected = hf_tokenizer.encode(TEXT, add_special_tokens=add_special)
        assert body.tokens == expected
        assert body.count == len(expected)
        assert body.max_model_len == engine.model_config.max_model_len
        assert r.json()["token_strs"] is None  # present, null, unless asked for


def test_tokenize_return_token_strs_and_detokenize(client, hf_tokenizer):
    r = client.post("/tokenize", json={"prompt": TEXT, "return_token_strs": True})
    body = vs.TokenizeResponse.model_validate(r.json())
    assert body.token_strs == hf_tokenizer.convert_ids_to_tokens(body.tokens)
    ids = hf_tokenizer.encode("this is a test prompt.", add_special_tokens=False)
    r = client.post("/detokenize", json={"tokens": ids})
    assert vs.DetokenizeResponse.model_validate(r.json()).prompt == "this is a test prompt."


def test_text_and_token_inputs_single_and_batched(client, model_name, engine, hf_tokenizer):
    ids = hf_tokenizer.encode(TEXT)
    expected = engine.embed([TEXT])[0].embedding
    for inputs, n in ((TEXT, 1), (ids, 1), ([TEXT] * 3, 3), ([ids] * 3, 3)):
        body = _embed(client, model=model_name, input=inputs, encoding_format="float")
        assert body.id.startswith("embd-")
        assert len(body.data) == n and [d.index for d in body.data] == list(range(n))
        assert len(body.data[0].embedding) == 384
        assert body.usage.completion_tokens == 0
        assert body.usage.prompt_tokens == body.usage.total_tokens == len(ids) * n
        for d in body.data:
            np.testing.assert_allclose(d.embedding, expected, atol=1e-5)


def test_request_id_names_the_response(client):
    assert _embed(client, input="a", request_id="abc").id == "embd-abc"


def test_truncate_prompt_tokens(client, model_name, engine):
    text = "Como o Brasil pode fomentar o desenvolvimento de modelos de IA?"
    body = _embed(client, model=model_name, input=[text], truncate_prompt_tokens=10)
    assert body.usage.prompt_tokens == body.usage.total_tokens == 10
    np.testing.assert_allclose(body.data[0].embedding, engine.embed(
        [text], truncate_prompt_tokens=10)[0].embedding, atol=1e-5)
    max_len = engine.model_config.max_model_len
    r = client.post("/v1/embeddings", json={"input": [text], "truncate_prompt_tokens": max_len + 1})
    assert r.status_code == 400
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert error.code == 400 and error.type == "BadRequestError"
    assert error.message == ("truncate_prompt_tokens value is greater than max_model_len. "
                             "Please request a smaller truncation size.")
    assert error.param == "truncate_prompt_tokens"
    body = _embed(client, input="calculus " * 400, truncate_prompt_tokens=-1)
    assert body.usage.prompt_tokens == max_len
    body = _embed(client, input="calculus " * 400, truncate_prompt_tokens=10,
                  truncation_side="left")
    np.testing.assert_allclose(body.data[0].embedding, engine.embed(
        ["calculus " * 400], truncate_prompt_tokens=10,
        truncation_direction="left")[0].embedding, atol=1e-5)


def test_base64_float32_matches_float(client, model_name):
    texts = ["Hello my name is", TEXT]
    floats = [d.embedding for d in _embed(client, model=model_name, input=texts).data]
    encoded = _embed(client, model=model_name, input=texts, encoding_format="base64")
    for d, f in zip(encoded.data, floats):
        got = np.frombuffer(base64.b64decode(d.embedding), dtype="float32")
        np.testing.assert_array_equal(got, np.asarray(f, dtype=np.float32))


def test_openai_client_default_base64(url, model_name, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1")
    texts = ["Hello my name is", TEXT]
    got = client.embeddings.create(input=texts, model=model_name)  # base64 under the hood
    for d, e in zip(got.data, engine.embed(texts)):
        np.testing.assert_allclose(d.embedding, e.embedding, atol=1e-6)


@pytest.mark.parametrize("embed_dtype", list(vs.EMBED_DTYPES))
def test_base64_embed_dtype_and_endianness(client, model_name, embed_dtype):
    texts = [TEXT] * 3
    floats = np.asarray([d.embedding for d in _embed(client, model=model_name,
                                                     input=texts).data])
    tol = {"float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}.get(embed_dtype, 1e-1)
    for endianness in vs.ENDIANNESS:
        body = _embed(client, model=model_name, input=texts, encoding_format="base64",
                      embed_dtype=embed_dtype, endianness=endianness)
        got = np.stack([vs.decode_base64(d.embedding, embed_dtype, endianness)
                        for d in body.data])
        np.testing.assert_allclose(got, floats, atol=tol)


def test_big_and_little_endian_bytes_differ_as_byte_swaps(client):
    little = _embed(client, input="a", encoding_format="base64", endianness="little")
    big = _embed(client, input="a", encoding_format="base64", endianness="big")
    raw_l = np.frombuffer(base64.b64decode(little.data[0].embedding), "<f4")
    raw_b = np.frombuffer(base64.b64decode(big.data[0].embedding), ">f4")
    np.testing.assert_array_equal(raw_l, raw_b)


@pytest.mark.parametrize("embed_dtype", list(vs.EMBED_DTYPES))
def test_bytes_and_bytes_only_bodies(client, model_name, embed_dtype):
    texts = [TEXT, "short"]
    floats = np.asarray([d.embedding for d in _embed(client, model=model_name,
                                                     input=texts).data])
    tol = {"float32": 1e-7, "float16": 1e-3, "bfloat16": 1e-2}.get(embed_dtype, 1e-1)
    for endianness in vs.ENDIANNESS:
        r = client.post("/v1/embeddings", json={"model": model_name, "input": texts,
                                                "encoding_format": "bytes",
                                                "embed_dtype": embed_dtype,
                                                "endianness": endianness})
        assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
        meta, items = vs.metadata_of(r)
        assert meta["model"] == model_name and meta["id"].startswith("embd-")
        assert meta["usage"]["prompt_tokens"] > 0
        got = vs.decode_bytes_body(r.content, items)
        np.testing.assert_allclose(np.stack(got), floats, atol=tol)

        r = client.post("/v1/embeddings", json={"model": model_name, "input": texts,
                                                "encoding_format": "bytes_only",
                                                "embed_dtype": embed_dtype,
                                                "endianness": endianness})
        assert "metadata" not in r.headers
        size = len(r.content) // len(texts)
        got = [vs.decode_binary(r.content[i * size:(i + 1) * size], (384,), embed_dtype,
                                endianness) for i in range(len(texts))]
        np.testing.assert_allclose(np.stack(got), floats, atol=tol)


@pytest.mark.parametrize("param", ["encoding_format", "embed_dtype", "endianness"])
def test_bad_encoding_params_are_400s_naming_the_value(client, model_name, param):
    r = client.post("/v1/embeddings", json={"model": model_name, "input": TEXT,
                                            "encoding_format": "base64",
                                            param: f"bad_{param}"})
    assert r.status_code == 400
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert "literal_error" in error.message and f"bad_{param}" in error.message
    assert error.param == param


def test_use_activation_is_normalization(client, model_name, engine):
    def get(use_activation):
        body = _embed(client, model=model_name, input=TEXT, use_activation=use_activation)
        return np.asarray(body.data[0].embedding)

    default, with_act, without = get(None), get(True), get(False)
    np.testing.assert_allclose(default, with_act, atol=1e-6)
    assert not np.allclose(with_act, without, atol=1e-2)
    np.testing.assert_allclose(with_act, without / np.linalg.norm(without), atol=1e-5)
    raw = engine.embed([TEXT], use_activation=False)[0].embedding
    np.testing.assert_allclose(without, raw, atol=1e-5)


def test_add_special_tokens_false(client, hf_tokenizer, engine):
    body = _embed(client, input=TEXT, add_special_tokens=False)
    ids = hf_tokenizer.encode(TEXT, add_special_tokens=False)
    assert body.usage.prompt_tokens == len(ids)
    np.testing.assert_allclose(body.data[0].embedding, engine.embed([ids])[0].embedding,
                               atol=1e-5)


def test_pooling_embed_and_token_embed(client, model_name, hf_tokenizer, engine):
    r = client.post("/pooling", json={"model": model_name, "input": TEXT, "task": "embed"})
    body = vs.PoolingResponse.model_validate(r.json())
    assert body.id.startswith("pool-") and len(body.data) == 1 and len(body.data[0].data) == 384
    r = client.post("/pooling", json={"model": model_name, "input": TEXT,
                                      "task": "token_embed"})
    body = vs.PoolingResponse.model_validate(r.json())
    assert len(body.data[0].data) == len(hf_tokenizer.encode(TEXT))
    assert len(body.data[0].data[0]) == 384
    np.testing.assert_allclose(body.data[0].data, engine.token_embed([TEXT])[0].embeddings,
                               atol=1e-5)


def test_pooling_bytes_keeps_the_token_matrix_shape(client, engine):
    r = client.post("/pooling", json={"input": ["a b c", "a"], "task": "token_embed",
                                      "encoding_format": "bytes", "embed_dtype": "float16"})
    assert r.status_code == 200, r.text
    _, items = vs.metadata_of(r)
    assert [i.shape for i in items] == [[5, 384], [3, 384]]
    got = vs.decode_bytes_body(r.content, items)
    assert got[0].shape == (5, 384)


@pytest.mark.parametrize("task", ["classify", "token_classify", "plugin"])
def test_pooling_unsupported_task(client, model_name, task):
    r = client.post("/pooling", json={"model": model_name, "input": "test",
                                      "encoding_format": "float", "task": task})
    assert r.status_code == 400
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert error.type == "BadRequestError"
    assert error.message.startswith(f"Unsupported task: {task!r}")


def test_invocations_dispatch_embeddings(client, model_name):
    args = {"model": model_name, "input": TEXT, "encoding_format": "float"}
    direct = client.post("/v1/embeddings", json=args).json()
    invoked = client.post("/invocations", json=args).json()
    assert direct.keys() == invoked.keys()
    for a, b in zip(direct["data"], invoked["data"]):
        assert a.keys() == b.keys()
        np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-6)


def test_invocations_without_a_matching_shape(client):
    r = client.post("/invocations", json={"nothing": "here"})
    assert r.status_code == 400
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert error.message.startswith("Cannot find suitable handler for request.")
    assert "EmbeddingRequest" in error.message


def test_unknown_model_is_a_404_in_vllm_shape(client):
    # /v1/embeddings takes any name, as TEI's (test_drop_in_residue.py); vLLM-only routes 404.
    r = client.post("/pooling", json={"model": "gpt-4", "input": "a"})
    assert r.status_code == 404
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert error.type == "NotFoundError" and error.code == 404
    assert error.message.startswith("The model `gpt-4` does not exist.")


def test_messages_without_a_chat_template(client):
    r = client.post("/v1/embeddings", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    error = vs.ErrorResponse.model_validate(r.json()).error
    assert "chat template" in error.message and error.param == "messages"


def test_shared_tokenize_path_keeps_tei_bodies(client):
    r = client.post("/tokenize", json={"inputs": "hello world"})
    assert r.status_code == 200
    assert [t["text"] for t in r.json()[0]] == ["[CLS]", "hello", "world", "[SEP]"]

