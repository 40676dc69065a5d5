"""The heap trimmer trims only after RSS grows past its threshold."""
from __future__ import annotations

import pytest

from pooler.worker.memory import HeapTrimmer


def test_trims_only_past_threshold(monkeypatch):
    trimmer = HeapTrimmer(threshold_mb=100)
    if trimmer._trim is None:
        pytest.skip("no glibc malloc_trim here")
    calls, rss = [], [500.0]
    monkeypatch.setattr(trimmer, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(HeapTrimmer, "rss_mb", staticmethod(lambda: rss[0]))
    trimmer.maybe_trim()            # first call sets the baseline
    rss[0] = 590.0
    trimmer.maybe_trim()
    assert calls == []
    rss[0] = 620.0
    trimmer.maybe_trim()
    assert calls == [0]
    assert trimmer._baseline_mb == 620.0
