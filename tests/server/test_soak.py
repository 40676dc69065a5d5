"""A small soak (the full 5,000 + 1,000 figures are in docs/benchmarks.md): varied requests
in a row, then concurrent ColBERT reranks with random client disconnects. No errors, every
kept call answered, nothing left queued or cached at idle, RSS flat."""
from __future__ import annotations

import asyncio

from pooler.bench.soak import SoakReport, concurrent_colbert, sequential, wait_idle
from pooler.server.settings import ServerSettings


def test_sequential_soak(engine, serve_app):
    with serve_app(engine, ServerSettings(max_queue_tokens=10**7)) as (url, _):
        sequential(url, 20, SoakReport(), seed=1)  # warm up: the allocator sees the shapes
        report = SoakReport()
        sequential(url, 80, report, samples=4)
        assert not report.errors, report.errors[:3]
        assert report.answered == 80
        assert not any(wait_idle(engine).values())
        # Measured (docs/benchmarks.md): RSS still rises by ~1 MB per request over the first
        # few hundred varied requests, offline too (an open question, see the closing note);
        # this bound catches a leak of several MB per request, not that.
        first, last = report.rss_samples[0][1], report.rss_samples[-1][1]
        assert last - first < 400, report.rss_samples


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
