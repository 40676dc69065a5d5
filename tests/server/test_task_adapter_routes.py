"""jina-embeddings-v3's task adapters over HTTP (issue 43, item 5): Jina's `task` on
/v1/embeddings, an adapter's name as `model` (vLLM's LoRA rule, TEI's and Cohere's routes too),
Cohere's `input_type`, and /v1/models listing them; each answer equals the offline engine with
that adapter (tests/models/test_task_adapters.py holds those equal to the adapter merged at
load), and concurrent requests for different adapters are answered as each alone."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from pooler.engine.llm import Engine
from pooler.server.settings import ServerSettings
from tests.models.remote_layout_folders import JINA_TASKS, build_jina_remote
from tests.models.rotary_folders import require_family
from tests.server.conftest import serve

TEXTS = ["the quick brown fox", "a cat sat on the mat", "paris is the capital of france"]
ATOL = 1e-5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_family("jina_embeddings_v3")
    folder = tmp_path_factory.mktemp("jina_server") / "jina"
    build_jina_remote(folder, adapt_token_types=True)
    engine = Engine(str(folder), device="cpu")
    expected = {task: np.stack([o.embedding for o in engine.embed(TEXTS, task=task)])
                for task in JINA_TASKS}
    expected.update({f"lora:{task}": np.stack([o.embedding for o in
                                               engine.embed(TEXTS, lora=task)])
                     for task in JINA_TASKS})
    with serve(engine, ServerSettings(served_model_name="jina")) as (url, _):
        yield url, expected
    engine.shutdown()


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def _vectors(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def test_models_lists_the_task_adapters(served):
    url, _ = served
    ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
    assert ids == ["jina", *JINA_TASKS]


def test_jina_task_field(served):
    url, expected = served
    for task in ("retrieval.query", "separation"):
        got = _vectors(_post(url, "/v1/embeddings", {"input": TEXTS, "model": "jina",
                                                     "task": task}))
        np.testing.assert_allclose(got, expected[task], atol=ATOL, err_msg=task)
    r = _post(url, "/v1/embeddings", {"input": TEXTS, "task": "retrieval"})
    assert r.status_code == 400 and "task='retrieval' is not one of" in r.text
    assert r.json()["error"]["param"] == "task"


def test_adapter_name_as_model(served):
    url, expected = served
    got = _vectors(_post(url, "/v1/embeddings", {"input": TEXTS, "model": "classification"}))
    np.testing.assert_allclose(got, expected["lora:classification"], atol=ATOL)
    # TEI's /embed takes any model name; an adapter's picks it on Cohere's routes.
    r = _post(url, "/v2/embed", {"texts": TEXTS, "model": "retrieval.passage",
                                 "embedding_types": ["float"]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["embeddings"]["float"]),
                               expected["lora:retrieval.passage"], atol=ATOL)
    # The adapter merged at load is a name too: the base's answer.
    got = _vectors(_post(url, "/v1/embeddings", {"input": TEXTS, "model": "text-matching"}))
    base = _vectors(_post(url, "/v1/embeddings", {"input": TEXTS}))
    np.testing.assert_allclose(got, base, atol=ATOL)


@pytest.mark.parametrize("input_type,task", [("search_query", "retrieval.query"),
                                             ("search_document", "retrieval.passage"),
                                             ("classification", "classification"),
                                             ("clustering", "separation")])
def test_cohere_input_type_picks_the_adapter(served, input_type, task):
    url, expected = served
    r = _post(url, "/v2/embed", {"texts": TEXTS, "model": "embed-english-v3.0",
                                 "input_type": input_type, "embedding_types": ["float"]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()["embeddings"]["float"]), expected[task],
                               atol=ATOL)


def test_cohere_conflicting_choices_are_a_400(served):
    url, _ = served
    r = _post(url, "/v2/embed", {"texts": TEXTS, "model": "separation",
                                 "input_type": "search_query"})
    assert r.status_code == 400 and "already names the adapter 'separation'" in r.text


def test_concurrent_requests_for_different_adapters(served):
    url, expected = served
    tasks = JINA_TASKS * 3

    def one(task):
        return task, _vectors(_post(url, "/v1/embeddings", {"input": TEXTS, "task": task}))

    with ThreadPoolExecutor(8) as pool:
        for task, got in pool.map(one, tasks):
            np.testing.assert_allclose(got, expected[task], atol=ATOL, err_msg=task)


def test_spec_names_the_adapters_as_task_values(served):
    url, _ = served
    spec = httpx.get(f"{url}/openapi.json").json()
    task = spec["components"]["schemas"]["EmbeddingRequest"]["properties"]["task"]
    assert {"type": "string", "enum": JINA_TASKS} in task["anyOf"]
    # /pooling's `task` stays the pooling tasks.
    pooling = spec["components"]["schemas"]["PoolingRequest"]["properties"]["task"]
    assert "retrieval.query" not in str(pooling) and "embed" in str(pooling)
