"""vLLM's chat (`messages`) inputs on /v1/embeddings, /pooling, /classify, /tokenize and
/invocations (tests/entrypoints/pooling/embed/test_online.py::test_chat_request,
classify/test_online.py::test_chat_request, openai/test_tokenization.py::test_tokenize_chat),
on models whose tokenizer_config.json has a chat template. The rendered prompt is checked
against transformers' apply_chat_template on the same tokenizer folder."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from pooler import Engine
from tests.server import vllm_schema as vs

TEMPLATE = ("{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")
MESSAGES = [{"role": "user", "content": "The cat sat on the mat."},
            {"role": "assistant", "content": "A feline was resting on a rug."},
            {"role": "user", "content": "Stars twinkle brightly in the night sky."}]


def _with_chat_template(folder: Path) -> Path:
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config))
    return folder


def _linked_copy(source: Path, target: Path) -> Path:
    """The model folder with every file linked, so tokenizer_config.json can be edited."""
    for item in source.iterdir():
        if item.name == "tokenizer_config.json":
            (target / item.name).write_text(item.read_text())
        else:
            (target / item.name).symlink_to(item.resolve())
    return target


@pytest.fixture(scope="module")
def chat_embedder(tmp_path_factory, minilm_path, serve_app):
    folder = _with_chat_template(_linked_copy(minilm_path, tmp_path_factory.mktemp("chat")))
    engine = Engine(str(folder))
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine, folder


@pytest.fixture(scope="module")
def chat_classifier(tmp_path_factory, minilm_path, tiny_model, serve_app):
    folder = tiny_model(tmp_path_factory.mktemp("chatcls"), minilm_path,
                        "BertForSequenceClassification", 2, {0: "Default", 1: "Spoiled"})
    engine = Engine(str(_with_chat_template(folder)))
    with serve_app(engine, owns_engine=True) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine, folder


def _reference_prompt(folder: Path, messages, **kwargs) -> tuple[str, object]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs), tokenizer


def test_chat_embeddings_equal_the_rendered_prompt(chat_embedder):
    client, engine, folder = chat_embedder
    r = client.post("/v1/embeddings", json={"messages": MESSAGES, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    chat = vs.EmbeddingResponse.model_validate(r.json())
    prompt, tokenizer = _reference_prompt(folder, MESSAGES, add_generation_prompt=False)
    completion = vs.EmbeddingResponse.model_validate(client.post("/v1/embeddings", json={
        "input": prompt, "add_special_tokens": False}).json())
    np.testing.assert_allclose(chat.data[0].embedding, completion.data[0].embedding, atol=1e-6)
    assert chat.usage == completion.usage
    assert chat.created <= completion.created
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert chat.usage.prompt_tokens == len(ids)
    np.testing.assert_allclose(chat.data[0].embedding, engine.embed([ids])[0].embedding,
                               atol=1e-5)


@pytest.mark.parametrize("options", [{"add_generation_prompt": True},
                                     {"continue_final_message": True},
                                     {"add_special_tokens": True}])
def test_chat_options_change_the_prompt_as_transformers_does(chat_embedder, options):
    client, _, folder = chat_embedder
    r = client.post("/v1/embeddings", json={"messages": MESSAGES, **options})
    assert r.status_code == 200, r.text
    body = vs.EmbeddingResponse.model_validate(r.json())
    template_options = {k: v for k, v in options.items() if k != "add_special_tokens"}
    prompt, tokenizer = _reference_prompt(folder, MESSAGES, **template_options)
    ids = tokenizer.encode(prompt, add_special_tokens=options.get("add_special_tokens", False))
    assert body.usage.prompt_tokens == len(ids)


def test_chats_in_input_and_batched_chats(chat_embedder):
    """vLLM also takes a chat in `input`, and a list of chats in `messages` or `input`."""
    client, _, _ = chat_embedder
    other = MESSAGES[:1]
    one, two = ([d.embedding for d in vs.EmbeddingResponse.model_validate(client.post(
        "/v1/embeddings", json={"messages": chat}).json()).data] for chat in (MESSAGES, other))
    for body, expected in (({"input": MESSAGES}, one),
                           ({"messages": [MESSAGES, other]}, one + two),
                           ({"input": [MESSAGES, other]}, one + two)):
        r = client.post("/v1/embeddings", json=body)
        got = [d.embedding for d in vs.EmbeddingResponse.model_validate(r.json()).data]
        np.testing.assert_allclose(got, expected, atol=1e-6)
    r = client.post("/v1/embeddings", json={"messages": [MESSAGES, []]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_both_generation_flags_is_an_error(chat_embedder):
    client, _, _ = chat_embedder
    r = client.post("/v1/embeddings", json={"messages": MESSAGES, "continue_final_message": True,
                                            "add_generation_prompt": True})
    assert r.status_code == 400
    assert ("Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            in r.json()["error"]["message"])


def test_chat_on_pooling_and_invocations(chat_embedder):
    client, _, _ = chat_embedder
    direct = client.post("/v1/embeddings", json={"messages": MESSAGES}).json()
    invoked = client.post("/invocations", json={"messages": MESSAGES}).json()
    assert direct.keys() == invoked.keys()
    np.testing.assert_allclose(direct["data"][0]["embedding"], invoked["data"][0]["embedding"],
                               atol=1e-6)
    pooled = vs.PoolingResponse.model_validate(client.post("/pooling", json={
        "messages": MESSAGES, "task": "embed"}).json())
    np.testing.assert_allclose(pooled.data[0].data, direct["data"][0]["embedding"], atol=1e-6)


def test_tokenize_chat_matches_transformers(chat_embedder):
    client, engine, folder = chat_embedder
    for add_generation in (False, True):
        for add_special in (False, True):
            for continue_final in (False, True):
                if add_generation and continue_final:
                    continue
                conversation = MESSAGES + ([{"role": "assistant", "content": "Sure,"}]
                                           if continue_final else [])
                prompt, tokenizer = _reference_prompt(
                    folder, conversation, add_generation_prompt=add_generation,
                    continue_final_message=continue_final)
                expected = tokenizer.encode(prompt, add_special_tokens=add_special)
                r = client.post("/tokenize", json={
                    "messages": conversation, "add_generation_prompt": add_generation,
                    "continue_final_message": continue_final,
                    "add_special_tokens": add_special})
                body = vs.TokenizeResponse.model_validate(r.json())
                assert body.tokens == expected and body.count == len(expected)
                assert body.max_model_len == engine.model_config.max_model_len
                assert body.token_strs is None


def test_tokenize_chat_with_tools_matches_transformers(chat_embedder):
    """The request's tools reach the template, as transformers passes them."""
    client, _, folder = chat_embedder
    template = ("{% if tools %}{% for t in tools %}{{ 'tool: ' + t['function']['name'] + '\\n' }}"
                "{% endfor %}{% endif %}" + TEMPLATE)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}}}}]
    conversation = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    prompt, tokenizer = _reference_prompt(folder, conversation, tools=tools,
                                          chat_template=template)
    assert "get_weather" in prompt
    r = client.post("/tokenize", json={"messages": conversation, "tools": tools,
                                       "chat_template": template})
    assert vs.TokenizeResponse.model_validate(r.json()).tokens == tokenizer.encode(
        prompt, add_special_tokens=False)


def test_request_chat_template_and_text_parts(chat_embedder):
    client, _, _ = chat_embedder
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"},
                                          {"type": "text", "text": "world"}]}]
    r = client.post("/tokenize", json={"messages": parts, "return_token_strs": True,
                                       "chat_template": "{{ messages[0]['content'] }}"})
    assert r.json()["token_strs"] == ["hello", "world"]
    r = client.post("/tokenize", json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert r.status_code == 400 and "text parts" in r.json()["error"]["message"]


def test_classify_chat_and_invocations(chat_classifier):
    client, engine, folder = chat_classifier
    r = client.post("/classify", json={"messages": MESSAGES})
    assert r.status_code == 200, r.text
    body = vs.ClassificationResponse.model_validate(r.json())
    prompt, tokenizer = _reference_prompt(folder, MESSAGES)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert body.usage.prompt_tokens == len(ids)
    np.testing.assert_allclose(body.data[0].probs, engine.classify([ids])[0].probs, atol=1e-6)
    assert body.data[0].label in ("Default", "Spoiled") and body.data[0].num_classes == 2
    invoked = client.post("/invocations", json={"messages": MESSAGES}).json()
    assert invoked.keys() == r.json().keys()
    np.testing.assert_allclose(invoked["data"][0]["probs"], body.data[0].probs, atol=1e-6)
