"""The bench's int8 additions: the forced-AVX2 side on a VNNI CPU, the path note, the ratio of
each pooler variant to pooler fp32, and the long corpus."""
from __future__ import annotations

from pooler.bench import corpus
from pooler.bench.common import pooler_sides
from pooler.bench.registry import BenchOptions
from pooler.bench.runner import Row, pooler_ratio_lines
from pooler.kernels.int8_cpu import runnable_paths


def _row(workload: str, side: str, ratio: float) -> Row:
    return Row(workload, side, "pooler", 1.0, 1.0, None, None, 0, 0, ratio, None, None, None)


def test_ratio_lines_compare_each_variant_to_pooler_fp32():
    rows = [_row("embed", "pooler", 1.5), _row("embed", "pooler int8", 3.0),
            _row("embed", "pooler int8 avx2", 2.25), _row("embed", "st b32", 1.0),
            _row("colbert", "pooler 1x100", 1.4), _row("colbert", "pooler int8 1x100", 2.8),
            _row("single_query", "pooler", 0.40), _row("single_query", "pooler-int8", 0.38)]
    assert pooler_ratio_lines(rows) == [
        "embed: pooler int8 vs pooler (fp32) 2.00x",
        "embed: pooler int8 avx2 vs pooler (fp32, this CPU's best build) 1.50x",
        "colbert: pooler int8 1x100 vs pooler (fp32) 2.00x",
        "single_query: pooler-int8 vs pooler (fp32) 0.95x"]


def test_int8_sides_include_the_forced_avx2_build_on_a_vnni_cpu():
    opts = BenchOptions(model="m", threads=1, quantization="int8")
    names = [s.name for s in pooler_sides(opts, lambda q, side: (lambda o: None))]
    expected = ["pooler", "pooler int8"]
    if runnable_paths()[:1] == ["avx512-vnni"]:
        expected.append("pooler int8 avx2")
    assert names == expected
    assert [s.name for s in pooler_sides(BenchOptions(model="m", threads=1),
                                          lambda q, side: None)] == ["pooler"]


def test_long_corpus_is_deterministic_and_long():
    texts = corpus.long_corpus(20)
    assert texts == corpus.long_corpus(20) and len(texts) == 20
    assert min(len(t.split()) for t in texts) >= 100


def test_interleaved_side_reports_its_own_rounds():
    """A side timed against fp32 in alternating rounds in one process prints the median of its
    own per-round ratios, not the quotient of two sides run one after another."""
    rows = [_row("embed", "pooler", 1.0), _row("embed", "pooler int8", 3.0),
            _row("embed", "pooler int8 interleaved", 2.0)]
    rows[2].interleaved_vs_fp32 = [2.5, 2.7, 2.6]
    assert pooler_ratio_lines(rows) == [
        "embed: pooler int8 vs pooler (fp32) 3.00x",
        "embed: pooler int8 interleaved vs pooler (fp32), alternating rounds in one process "
        "2.60x (median; rounds 2.50, 2.70, 2.60)"]


def test_avx2_interleaved_side_names_its_fp32_build():
    """The AVX2 side timed in alternating rounds ran fp32 on the AVX2 build too: its line says
    so, where the sequential AVX2 side's ratio is to fp32 on this CPU's best build."""
    rows = [_row("embed", "pooler", 1.0), _row("embed", "pooler int8 avx2 interleaved", 1.6)]
    rows[1].interleaved_vs_fp32 = [1.5, 1.7, 1.6]
    assert pooler_ratio_lines(rows) == [
        "embed: pooler int8 avx2 interleaved vs pooler (fp32, AVX2 build too), alternating "
        "rounds in one process 1.60x (median; rounds 1.50, 1.70, 1.60)"]


def test_avx2_sides_hold_pooler_and_onednn_to_avx2(monkeypatch):
    """Both forced-AVX2 sides set the environment an AVX2-only CPU would give pooler's C
    kernels and oneDNN, in their own process, before any engine is built."""
    import os

    from pooler.bench.common import AVX2_ENV, with_env

    for name in AVX2_ENV:  # recorded, so teardown undoes what with_env sets
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    seen = {}
    run = with_env(lambda opts: seen.update({k: os.environ.get(k) for k in AVX2_ENV}),
                   AVX2_ENV)
    run(None)
    assert seen == {"POOLER_CPU_KERNELS": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_embed_adds_an_interleaved_side_per_requested_variant():
    from pooler.bench.registry import get_workload
    from pooler.model_folder import DEFAULT_MODEL

    embed = get_workload("embed")
    names = lambda **kw: [s.name for s in embed.sides(  # noqa: E731
        BenchOptions(model=DEFAULT_MODEL, threads=1, **kw)) if s.role == "pooler"]
    assert "pooler int8 interleaved" in names(quantization="int8")
    # the AVX2 build against fp32 on AVX2, where this CPU can run both it and a better build
    assert ("pooler int8 avx2 interleaved" in names(quantization="int8")) == (
        runnable_paths()[:1] == ["avx512-vnni"] and "avx2" in runnable_paths())
    assert "pooler int8 avx2 interleaved" not in names(dtype="bfloat16")
    assert "pooler bf16 interleaved" in names(dtype="bfloat16")
    assert not any("interleaved" in n for n in names())
    assert not any("interleaved" in n for n in
                   names(quantization="int8", extra={"interleaved_rounds": 0}))
    assert not any("interleaved" in n for n in names(dtype="bfloat16", device="cuda"))
