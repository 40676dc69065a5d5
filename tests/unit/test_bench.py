"""`pooler bench --quick` on a seeded tiny model: every side runs and lands in the table.
A smoke test of the harness, not a timing assertion."""
from __future__ import annotations

import pytest

from pooler.bench.registry import Workload, get_workload, load_workloads, register


@pytest.fixture(scope="module")
def tiny_st_model(tmp_path_factory):
    """A 2-layer BERT with mean pooling + Normalize, saved as a sentence-transformers folder."""
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("sentence_transformers")
    import torch

    from pooler.bench.corpus import _WORDS

    root = tmp_path_factory.mktemp("tiny-st")
    hf_dir, st_dir = root / "hf", root / "st"
    hf_dir.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", "!"] + sorted(set(_WORDS))
    (hf_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(hf_dir / "vocab.txt")).save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=512)
    transformers.BertModel(config).save_pretrained(hf_dir)
    m = st.models
    encoder = m.Transformer(str(hf_dir), max_seq_length=128)
    pooling = m.Pooling(encoder.get_word_embedding_dimension(), "mean")
    st.SentenceTransformer(modules=[encoder, pooling, m.Normalize()], device="cpu").save(
        str(st_dir))
    return st_dir


def test_quick_bench_prints_both_sides(tiny_st_model, capsys):
    from pooler.cli.main import main

    rc = main(["bench", "--quick", "--model", str(tiny_st_model), "--threads", "1",
               "--workload", "embed,single_query"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "FAILED" not in out
    rows = [line.split() for line in out.splitlines()]
    sides = {(r[0], r[1]) for r in rows if r and r[0] in ("embed", "single_query")}
    assert {("embed", "pooler"), ("embed", "st"), ("single_query", "pooler"),
            ("single_query", "sentence-transformers")} <= sides
    assert "GFLOP/s" in out and "ceiling" in out
    # The pooler row of embed carries a ratio to the peer and cosines to its outputs.
    pooler_row = next(line for line in out.splitlines() if line.startswith("embed") and
                      line.split()[1] == "pooler")
    assert "x" in pooler_row and "1.000000" in pooler_row


def test_registry_lists_and_rejects():
    names = load_workloads()
    assert {"embed", "single_query"} <= set(names)
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("nope")
    with pytest.raises(ValueError, match="metric"):
        register(Workload("bad", "", "speed", lambda o: [], "x"))
