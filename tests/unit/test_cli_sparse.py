"""`pooler sparse` writes one JSON line per text with the same weights as Engine.embed_sparse."""
from __future__ import annotations

import json

from pooler.cli.main import main
from tests.models.test_splade import SPLADE_TINY, needs_splade_tiny


@needs_splade_tiny
def test_cli_sparse_jsonl(tmp_path, capsys):
    from pooler import Engine

    out = tmp_path / "out.jsonl"
    code = main(["sparse", "--model", str(SPLADE_TINY), "--device", "cpu", "--top-k", "4",
                 "--tokens", "-o", str(out), "hello world", "sparse retrieval"])
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in lines] == ["hello world", "sparse retrieval"]
    expected = Engine(str(SPLADE_TINY), device="cpu").embed_sparse("sparse retrieval", top_k=4)[0]
    assert {int(k): v for k, v in lines[1]["weights"].items()} == {
        k: round(v, 6) for k, v in expected.to_dict().items()}
    assert list(lines[1]["tokens"]) == expected.tokens


def test_cli_sparse_rejects_a_model_without_mlm_head(tmp_path, capsys):
    from tests.models.modernbert_folders import build_modernbert

    build_modernbert(tmp_path / "base", "ModernBertModel")
    code = main(["sparse", "--model", str(tmp_path / "base"), "--device", "cpu", "text"])
    assert code == 2
    err = capsys.readouterr().err
    assert "masked-LM" in err and "pooler sparse --model PATH" in err
