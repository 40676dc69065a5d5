"""LoRA over HTTP (issue 31): the request's `model` picks the adapter on every route that takes
one, /v1/models lists the adapters, vLLM's load/unload routes (behind --api-key), a 404 naming
the known adapters, and concurrent requests for different adapters answered as each alone."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from pooler.engine.llm import Engine
from pooler.server.settings import ServerSettings
from tests.models.lora_folders import save_lora
from tests.models.tiny import add_st_pooling
from tests.models.tiny_task_models import save_bert_task_model
from tests.server.conftest import serve

pytest.importorskip("peft")

TEXTS = ["the quick brown fox", "a cat sat on the mat", "paris is the capital of france"]
KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    base = save_bert_task_model(root / "base", "base", seed=1)
    add_st_pooling(base, "mean")
    return base, {
        "alpha": save_lora(base, root / "alpha", "BertModel", seed=2, r=4,
                           target_modules=["query", "value", "dense"]),
        "beta": save_lora(base, root / "beta", "BertModel", seed=3, r=2,
                          target_modules=["key"]),
    }


@pytest.fixture(scope="module")
def expected(folders):
    """Offline results (tests/models/test_lora.py holds them equal to peft's merged models)."""
    base, adapters = folders
    engine = Engine(str(base), lora_modules={k: str(v) for k, v in adapters.items()})
    return {name: np.stack([o.embedding for o in engine.embed(TEXTS, lora=name)])
            for name in (None, "alpha", "beta")}


@pytest.fixture(scope="module")
def server(folders):
    base, adapters = folders
    engine = Engine(str(base), lora_modules={"alpha": str(adapters["alpha"])})
    with serve(engine, ServerSettings(served_model_name="tiny", api_key=KEY)) as (url, _):
        yield url, adapters
    engine.shutdown()


def _embed(url: str, model: str | None, texts=TEXTS) -> np.ndarray:
    body = {"input": texts, **({"model": model} if model else {})}
    r = httpx.post(f"{url}/v1/embeddings", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def test_model_field_picks_the_adapter(server, expected):
    url, _ = server
    np.testing.assert_allclose(_embed(url, "alpha"), expected["alpha"], atol=1e-6)
    np.testing.assert_allclose(_embed(url, "tiny"), expected[None], atol=1e-6)
    np.testing.assert_allclose(_embed(url, None), expected[None], atol=1e-6)
    # vLLM's /pooling route takes the adapter from `model` too.
    r = httpx.post(f"{url}/pooling", json={"model": "alpha", "input": TEXTS[0],
                                           "task": "embed"}, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["data"], expected["alpha"][0], atol=1e-6)


def test_models_lists_adapters(server):
    url, _ = server
    data = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"]
    assert [m["id"] for m in data][:2] == ["tiny", "alpha"]
    assert data[1]["parent"] == "tiny"


def test_unknown_adapter_is_404_naming_the_known(server):
    url, _ = server
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "gamma", "input": "x"}, headers=AUTH)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "gamma" in message and "alpha" in message and "tiny" in message


def test_load_and_unload_at_run_time(server, expected):
    url, adapters = server
    load = {"lora_name": "beta", "lora_path": str(adapters["beta"])}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 401
    r = httpx.post(f"{url}/v1/load_lora_adapter", json=load, headers=AUTH, timeout=60)
    assert r.status_code == 200 and "beta" in r.text
    np.testing.assert_allclose(_embed(url, "beta"), expected["beta"], atol=1e-6)
    again = httpx.post(f"{url}/v1/load_lora_adapter", json=load, headers=AUTH)
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    bad = httpx.post(f"{url}/v1/load_lora_adapter", headers=AUTH, json={
        "lora_name": "nowhere", "lora_path": str(adapters["beta"].parent / "missing")})
    assert bad.status_code == 400 and "is not a folder" in bad.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "beta"}, headers=AUTH)
    assert r.status_code == 200
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "beta"},
                      headers=AUTH)
    assert gone.status_code == 404
    r = httpx.post(f"{url}/v1/embeddings", json={"model": "beta", "input": "x"}, headers=AUTH)
    assert r.status_code == 404
    np.testing.assert_allclose(_embed(url, "alpha"), expected["alpha"], atol=1e-6)


def test_concurrent_mixed_adapters(server, expected):
    url, _ = server
    picks = ["alpha", None, "alpha", "tiny", None, "alpha"] * 3
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda m: _embed(url, m), picks))
    for model, got in zip(picks, results):
        want = expected["alpha"] if model == "alpha" else expected[None]
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_load_refused_without_lora(folders):
    base, adapters = folders
    engine = Engine(str(base))
    with serve(engine) as (url, _):
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={
            "lora_name": "alpha", "lora_path": str(adapters["alpha"])})
        assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]
    engine.shutdown()


def test_cli_parses_lora_modules():
    from pooler.cli.serve import parse_lora_module

    assert parse_lora_module("a=/x/y") == ("a", "/x/y")
    assert parse_lora_module('{"name": "b", "path": "/p"}') == ("b", "/p")
    with pytest.raises(Exception, match="NAME=PATH"):
        parse_lora_module("nopath")
