"""The heap trimmer trims only after RSS grows past its threshold."""
from __future__ import annotations

import pytest

from pooler.worker.memory import HeapTrimmer, _libc


def test_trims_only_past_threshold(monkeypatch):
    trimmer = HeapTrimmer(threshold_mb=100)
    if trimmer._trim is None:
        pytest.skip("no glibc malloc_trim here")
    calls, rss = [], [500.0]
    monkeypatch.setattr(trimmer, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(HeapTrimmer, "rss_mb", staticmethod(lambda: rss[0]))
    trimmer.maybe_trim(10)          # first call sets the baseline
    rss[0] = 590.0
    trimmer.maybe_trim(5000)
    assert calls == []
    rss[0] = 620.0
    trimmer.maybe_trim(5000)
    assert calls == [0]
    assert trimmer._baseline_mb == 620.0


def test_reads_rss_only_every_check_every_tokens(monkeypatch):
    """Small steps (one short query) skip the /proc read until enough tokens have run."""
    trimmer = HeapTrimmer(threshold_mb=100, check_every_tokens=100)
    if trimmer._trim is None:
        pytest.skip("no glibc malloc_trim here")
    reads, calls = [], []
    monkeypatch.setattr(trimmer, "_trim", lambda pad: calls.append(pad) or 1)
    monkeypatch.setattr(HeapTrimmer, "rss_mb", staticmethod(lambda: reads.append(1) or 900.0))
    trimmer.maybe_trim(12)  # the first step always reads (baseline)
    assert len(reads) == 1
    for _ in range(8):      # 96 tokens: below the check interval
        trimmer.maybe_trim(12)
    assert len(reads) == 1
    trimmer.maybe_trim(12)  # 108 tokens since the last read
    assert len(reads) == 2 and calls == []


def _tune_in_subprocess(env_extra: dict) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("POOLER_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    env.update(env_extra)
    code = "from pooler.worker.memory import tune_malloc_for_steps as t; print(t(), t())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_malloc_tuning_is_set_once_and_can_be_turned_off():
    """The glibc thresholds are process-global: pooler sets them unless told not to, and never
    over a user's own MALLOC_*_ settings."""
    if HeapTrimmer()._trim is None:
        pytest.skip("no glibc here")
    assert _tune_in_subprocess({}) == "True True"
    assert _tune_in_subprocess({"POOLER_MALLOC_TUNING": "0"}) == "False False"
    assert _tune_in_subprocess({"MALLOC_TRIM_THRESHOLD_": "1000000"}) == "False False"


_FAULTS_CODE = """
import resource, torch
from pooler.worker import memory
memory.tune_malloc_for_steps()
libc = memory._libc()
libc.mallinfo2.restype = memory._MallInfo2
def faults(active):
    x = torch.ones(8192, 1024)  # 32 MB blocks, each freed when the next is made (a layer's)
    with memory.large_blocks_from_heap(active):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(8):
            x = x * 1.5
            x = (x - 1).relu()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
def mmapped_blocks_while_held(active, mb):  # glibc's count of mmapped blocks
    with memory.large_blocks_from_heap(active):
        block = torch.empty(mb * 2**18)
        return libc.mallinfo2().hblks
base = libc.mallinfo2().hblks
print(faults(False), faults(True), mmapped_blocks_while_held(True, 96) - base,
      mmapped_blocks_while_held(False, 160) - base)
"""


def test_long_steps_reuse_their_32_mb_blocks_from_the_heap():
    """Inside large_blocks_from_heap the 32 MB blocks a chain of ops frees are the next ops'
    (a few faulted in at first); outside, glibc mmaps each one afresh (8,192 page faults per
    block). Leaving the scope gives large blocks back to mmap."""
    import subprocess
    import sys

    if HeapTrimmer()._trim is None or not hasattr(_libc(), "mallinfo2"):
        pytest.skip("no glibc >= 2.33 here")
    out = subprocess.run([sys.executable, "-c", _FAULTS_CODE], capture_output=True, text=True,
                         check=True).stdout.split()
    outside, inside, heap_block, after = (int(n) for n in out)
    assert outside >= 16 * (32 * 2**20 // 4096)  # every one of the 16 blocks faulted in
    assert inside <= outside // 3
    assert heap_block == 0  # a 96 MB block from the heap inside the scope
    assert after == 1       # mmapped again after it
