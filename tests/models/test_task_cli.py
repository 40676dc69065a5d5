"""`pooler classify` and `pooler ner` end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models.tiny_task_models import save_bert_task_model

_ROOT = Path(__file__).resolve().parents[2]
NER = next((p for p in (_ROOT / ".." / "shared" / "models" / "ner-pii-minilm",
                        _ROOT / ".." / ".." / "shared" / "models" / "ner-pii-minilm")
            if (p / "config.json").is_file()), None)


def run_cli(argv, capsys):
    from pooler.cli.main import main

    code = main(argv)
    return code, capsys.readouterr()


def test_classify_cli_with_pairs(tmp_path, capsys):
    path = save_bert_task_model(tmp_path / "m", "seq", num_labels=2)
    code, out = run_cli(["classify", "--model", str(path), "a cat", "a dog",
                         "--pair", "x", "--pair", "y"], capsys)
    assert code == 0
    records = [json.loads(line) for line in out.out.splitlines()]
    assert [r["text_pair"] for r in records] == ["x", "y"]
    assert all(r["label"] in ("LABEL_0", "LABEL_1") and len(r["labels"]) == 2
               for r in records)
    code, out = run_cli(["classify", "--model", str(path), "a", "--pair", "x", "--pair", "y"],
                        capsys)
    assert code == 2 and "one text_pair per input" in out.err


@pytest.mark.skipif(NER is None, reason="../shared/models/ner-pii-minilm is absent")
def test_ner_cli_prints_entities_with_offsets(capsys):
    text = "Contact Maria Garcia at maria.garcia@mail.com."
    code, out = run_cli(["ner", "--model", str(NER), text], capsys)
    assert code == 0
    [record] = [json.loads(line) for line in out.out.splitlines()]
    labels = {e["entity_group"]: e["text"] for e in record["entities"]}
    assert labels.get("EMAIL") == "maria.garcia@mail.com"
    for e in record["entities"]:
        assert text[e["start"]:e["end"]] == e["text"]
    code, out = run_cli(["ner", "--model", str(NER), "--table", text], capsys)
    assert code == 0 and "EMAIL" in out.out
