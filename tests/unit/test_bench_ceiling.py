"""The share of the FLOP ceiling is taken against the fastest GEMM rate the invocation
measured: a measurement slowed by a neighbour (shared VMs drift 1.5x within hours) must never
inflate a share."""
from __future__ import annotations

from pooler.bench.registry import BenchOptions, SideResult, Workload
from pooler.bench.runner import BenchReport, BenchRun, _rows, _shares_against, summary_lines


def _workload() -> Workload:
    return Workload("long_context", "test", "throughput", lambda opts: [], baseline="st")


def test_shares_are_restated_against_the_fastest_gemm():
    side = SideResult(side="pooler", role="pooler", texts=1,
                      tokens=8192, seconds=10.0, model_flops=2e12)
    run = BenchRun(rows=_rows(_workload(), [side], {}, None, gemm_gflops=200.0))
    run.ceilings["long_context"] = 1000.0
    assert abs(run.rows[0].ceiling_pct - 100.0) < 1e-9  # 200 GFLOP/s of 200
    # the first measurement (200) was slowed; a side measured 400 next to its timed part
    report = BenchReport(BenchOptions(model="m", threads=2), {}, [200.0, 250.0], {}, [run],
                         side_gemm_gflops=[400.0, 300.0])
    assert report.fastest_gemm == 400.0
    _shares_against(report.runs, used=200.0, fastest=report.fastest_gemm)
    assert abs(run.rows[0].ceiling_pct - 50.0) < 1e-9
    assert abs(run.ceilings["long_context"] - 2000.0) < 1e-9


def test_summary_names_every_gemm_measurement_and_the_one_used():
    machine = {"cpu": "x", "cpu_kind": "AVX2", "cpu_flags": "avx2", "cores": 2,
               "loadavg": [0, 0, 0], "python": "3", "torch": "2", "transformers": "5",
               "sentence-transformers": "6", "tokenizers": "0"}
    report = BenchReport(BenchOptions(model="m", threads=2), machine, [200.0, 250.0], {"embed": 1e8}, [],
                         side_gemm_gflops=[300.0, 400.0])
    text = "\n".join(summary_lines(report))
    assert "200, 250 GFLOP/s (before, after)" in text
    assert "in the sides' processes 300-400" in text and "use the fastest, 400" in text
    assert "fp32 ceiling 4000 tokens/s" in text  # 400 GFLOP/s / 100 MFLOP per token
