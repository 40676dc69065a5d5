"""A small soak (the full 5,000 + 1,000 figures are in docs/dev/journal.md): varied requests
in a row, then concurrent ColBERT reranks with random client disconnects. No errors, every
kept call answered, nothing left queued or cached at idle (in the engine and in /metrics),
memory flat once warm."""
from __future__ import annotations

import asyncio

from pooler.bench.soak import SoakReport, concurrent_colbert, scrape_idle_metrics, sequential, \
    wait_idle
from pooler.server.settings import ServerSettings

_SIZES = (1, 2, 4, 8)  # texts per request (the full soak goes up to 32)


def test_sequential_soak(engine, serve_app):
    with serve_app(engine, ServerSettings(max_queue_tokens=10**7)) as (url, _):
        # Warm up: more new step sizes than the bounded kernel caches hold (memory.py).
        sequential(url, 40, SoakReport(), seed=1, sizes=_SIZES)
        report = SoakReport()
        sequential(url, 80, report, samples=8, sizes=_SIZES)
        assert not report.errors, report.errors[:3]
        assert report.answered == 80
        assert not any(wait_idle(engine).values())
        metrics = scrape_idle_metrics(url)
        assert metrics["pooler_engine_tokens_waiting"] == 0, metrics
        # The live heap is flat once warm: before the kernel caches were bounded it grew by
        # ~1-2 MB per request (each brings a new step size), 80-160 MB here.
        if report.heap_samples:
            heap = [mb for _, mb in report.heap_samples]
            assert heap[-1] - heap[0] < 24, report.heap_samples
        # RSS also holds free heap until the trimmer returns it (128 MB past its baseline).
        rss = [mb for _, mb in report.rss_samples]
        assert max(rss) - rss[0] < 200, report.rss_samples


def test_concurrent_colbert_with_disconnects(tmp_path, serve_app):
    from pooler import Engine
    from tests.models.colbert_folders import build_tiny_stanford

    engine = Engine(str(build_tiny_stanford(tmp_path / "colbert")))
    with serve_app(engine, ServerSettings(max_queue_tokens=10**7), owns_engine=True) as (url, _):
        report = SoakReport()
        asyncio.run(concurrent_colbert(url, 60, report, disconnect_share=0.3, concurrency=16))
        assert not report.errors, report.errors[:3]
        assert report.disconnected > 0 and report.answered == report.requests > 0
        state = wait_idle(engine)
        assert not any(state.values()), state
        # What an operator sees: the late-interaction cache gauges read 0 at idle.
        metrics = scrape_idle_metrics(url)
        for gauge in ("cached_queries", "pending_docs", "cached_bytes"):
            assert metrics[f"pooler_late_interaction_{gauge}"] == 0, metrics
