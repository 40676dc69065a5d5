"""The visual_retrieval bench workload: registered, its seeded pages and queries, and a --quick
run (tiny seeded ColModernVBert built at test time) that reports both libraries' index and
query rows with their phases, latencies and rounds, pooler's vectors and scores matching
transformers'. A smoke test of the harness, not a timing assertion."""
from __future__ import annotations

import io

import pytest


def test_visual_retrieval_is_registered_with_pooler_vs_transformers():
    from pooler.bench.registry import BenchOptions, get_workload

    workload = get_workload("visual_retrieval")
    assert workload.metric == "throughput" and workload.report_lines is not None
    assert [s.name for s in workload.sides(BenchOptions(model="unused", threads=1))] == [
        "colmodernvbert"]
    assert workload.baseline_of("colmodernvbert index pooler") == \
        "colmodernvbert index transformers"
    assert workload.baseline_of("colmodernvbert query pooler") == \
        "colmodernvbert query transformers"


def test_bench_pages_and_queries_are_seeded():
    from PIL import Image

    from pooler.bench.images import PAGE_SIZES, bench_pages, bench_queries

    pages = bench_pages(2, seed=0, tiny=True)
    assert pages == bench_pages(2, seed=0, tiny=True) != bench_pages(2, seed=1, tiny=True)
    assert {Image.open(io.BytesIO(p)).format for p in pages} == {"PNG"}
    assert Image.open(io.BytesIO(bench_pages(1)[0])).size == PAGE_SIZES[0]
    queries = bench_queries(6)
    assert queries == bench_queries(6) and all(4 <= len(q.split()) <= 10 for q in queries)


def test_vision_flops_per_tile_at_the_real_shape():
    """SigLIP-B/16 on a 512 px tile: 1,024 patches through 12 layers of width 768."""
    from pooler.bench.page_folders import vision_flops_per_tile

    config = {"vlm_config": {"vision_config": dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, patch_size=16,
        image_size=512)}}
    patches, h = 1024, 768
    expected = 2 * patches * 3 * 16 * 16 * h + 12 * (
        2 * patches * (4 * h * h + 2 * h * 3072) + 4 * patches * patches * h)
    assert vision_flops_per_tile(config) == expected


# Slow (builds a tiny folder, loads pooler and transformers: 4 s alone, 15 s under load on
# the 2-core machine): make test runs it, make test-quick leaves it out.
@pytest.mark.slow
def test_quick_run_reports_index_and_query_rows(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import torch

    from pooler.bench.registry import BenchOptions, get_workload
    from pooler.bench.runner import _rows

    monkeypatch.setenv("POOLER_BENCH_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    workload = get_workload("visual_retrieval")
    opts = BenchOptions(model="unused", threads=1, quick=True, out_dir=str(tmp_path))
    [side] = workload.sides(opts)
    results = side.run(opts)
    assert [r.side for r in results] == [
        "colmodernvbert index pooler", "colmodernvbert query pooler",
        "colmodernvbert index transformers", "colmodernvbert query transformers"]
    for r in results:
        assert r.error is None and r.texts > 0 and r.seconds > 0 and r.rounds_per_s
    index_rows, query_rows = results[::2], results[1::2]
    for r in index_rows:
        assert set(r.phases_s) == {"decode", "preprocess", "model"}
        assert r.texts == 2 and r.tokens > 0 and r.model_flops > 0
    for r in query_rows:
        assert set(r.phases_s) == {"encode", "maxsim"}
        assert len(r.latencies_ms) == r.texts == 4
    rows = {r.side: r for r in _rows(workload, results, {}, None, gemm_gflops=50.0)}
    # same page vectors and the same query x page scores as transformers
    for kind in ("index", "query"):
        pooler = rows[f"colmodernvbert {kind} pooler"]
        assert pooler.cos_min is not None and pooler.cos_min > 0.9999
        assert pooler.ratio is not None
    assert rows["colmodernvbert query pooler"].p50_ms > 0
    lines = workload.report_lines(list(rows.values()))
    assert any(line.startswith("visual_retrieval: colmodernvbert query pooler vs "
                               "colmodernvbert query transformers") and "p50" in line
               for line in lines)
    assert any(line.startswith("visual_retrieval: colmodernvbert index transformers per page:")
               for line in lines)
