"""POST /ner with a GLiNER (zero-shot) model: labels per request, threshold, flat/nested, the
same entities as the offline Engine; 400s naming the field for bad input, and `labels` refused
on a token-classification model. The served OpenAPI spec stays truthful for a GLiNER server."""
from __future__ import annotations

import httpx
import pytest

from pooler import Engine
from tests.models.gliner_folders import LABELS, TEXTS, build_gliner

pytest.importorskip("gliner")


@pytest.fixture(scope="module")
def gliner_server(tmp_path_factory, serve_app):
    folder = build_gliner(tmp_path_factory.mktemp("gliner") / "gliner")
    engine = Engine(str(folder), device="cpu")
    with serve_app(engine, owns_engine=True) as (url, app), \
            httpx.Client(base_url=url, timeout=60) as client:
        yield client, engine, app


@pytest.mark.parametrize("flat_ner", [True, False])
def test_ner_with_labels_matches_the_engine(gliner_server, flat_ner):
    client, engine, _ = gliner_server
    r = client.post("/ner", json={"input": TEXTS, "labels": LABELS, "threshold": 0.2,
                                  "flat_ner": flat_ner})
    assert r.status_code == 200, r.text
    expected = engine.ner(TEXTS, labels=LABELS, threshold=0.2, flat_ner=flat_ner)
    assert sum(len(e) for e in expected) > 5
    for item, want in zip(r.json()["data"], expected):
        got = item["entities"]
        assert [(g["entity_group"], g["word"], g["start"], g["end"]) for g in got] == \
            [(e.label, e.word, e.start, e.end) for e in want]
        assert [g["score"] for g in got] == pytest.approx([e.score for e in want], abs=1e-6)


def test_labels_per_input_and_default_threshold(gliner_server):
    client, engine, _ = gliner_server
    label_sets = [["city"], ["animal", "thing"]]
    r = client.post("/ner", json={"input": TEXTS[:2], "labels": label_sets,
                                  "multi_label": True})
    assert r.status_code == 200, r.text
    expected = engine.ner(TEXTS[:2], labels=label_sets, multi_label=True)
    got = [[(g["entity_group"], g["start"], g["end"]) for g in item["entities"]]
           for item in r.json()["data"]]
    assert got == [[(e.label, e.start, e.end) for e in ents] for ents in expected]
    assert all(g[0] in s for ents, s in zip(got, label_sets) for g in ents)


@pytest.mark.parametrize("body,field", [
    ({"input": ["paris"]}, "labels"),
    ({"input": ["paris"], "labels": []}, "labels"),
    ({"input": ["paris"], "labels": [""]}, "labels"),
    ({"input": ["paris", "fox"], "labels": [["city"]]}, "labels"),
    ({"input": ["paris"], "labels": "city"}, "labels"),
    ({"input": ["paris"], "labels": [f"label number {i}" for i in range(40)]}, "labels"),
    ({"input": ["paris"], "labels": ["city"], "threshold": 0}, "threshold"),
    ({"input": ["paris"], "labels": ["city"], "threshold": 1.5}, "threshold"),
    ({"input": ["paris"], "labels": ["city"], "threshold": "high"}, "threshold"),
    ({"input": ["paris"], "labels": ["city"], "flat_ner": "yes"}, "flat_ner"),
    ({"input": ["paris"], "labels": ["city"], "aggregation_strategy": "max"},
     "aggregation_strategy"),
    ({"input": ["paris"], "labels": ["city"], "truncation_direction": "left"},
     "truncation_direction"),
])
def test_bad_gliner_requests_are_400_naming_the_field(gliner_server, body, field):
    client, _, _ = gliner_server
    r = client.post("/ner", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text
    # the server still serves afterwards
    assert client.post("/ner", json={"input": ["paris"], "labels": ["city"]}).status_code == 200


def test_openapi_spec_for_a_gliner_server(gliner_server):
    client, _, _ = gliner_server
    spec = client.get("/openapi.json").json()
    assert "/ner" in spec["paths"] and "/v1/embeddings" not in spec["paths"]
    ner = spec["components"]["schemas"]["NERRequest"]
    assert "labels" in ner["required"]
    strategy = ner["properties"]["aggregation_strategy"]  # or null: the default
    assert [o["enum"] for o in strategy.get("anyOf", [strategy]) if "enum" in o] == [["simple"]]
    # Label lists the spec promises fit the model's 128 tokens: the longest such list is served.
    labels = ner["properties"]["labels"]
    longest = ["x" * labels["items"]["maxLength"]] * labels["maxItems"]
    assert client.post("/ner", json={"input": ["paris"], "labels": longest}).status_code == 200


def test_labels_on_a_token_classification_model_are_400(tmp_path, serve_app):
    from tests.models.tiny_task_models import save_bert_task_model

    engine = Engine(str(save_bert_task_model(tmp_path / "token", "token")), device="cpu")
    with serve_app(engine, owns_engine=True) as (url, app), \
            httpx.Client(base_url=url, timeout=60) as client:
        for field, value in (("labels", ["city"]), ("threshold", 0.3), ("flat_ner", False)):
            r = client.post("/ner", json={"input": ["paris is nice"], field: value})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == field
            assert "GLiNER" in r.json()["error"]["message"]
        assert client.post("/ner", json={"input": ["paris is nice"]}).status_code == 200
        ner = client.get("/openapi.json").json()["components"]["schemas"]["NERRequest"]
        assert ner["properties"]["labels"]["type"] == "null"
