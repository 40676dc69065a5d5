"""oneDNN's and ideep's per-shape kernel caches are bounded (pooler/worker/memory.py): a
stream of new step sizes keeps the live heap flat once the caches are full, where the
libraries' default capacity (1,024 each) holds on to ~2 MB per new token count."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pooler.worker import memory
from pooler.worker.memory import KERNEL_CACHE_CAPACITY, bound_kernel_caches

_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY",
              "POOLER_KERNEL_CACHE_CAPACITY")


def test_bounds_both_caches_unless_the_user_chose(monkeypatch):
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    default = str(KERNEL_CACHE_CAPACITY)
    assert bound_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": default,
                                     "LRU_CACHE_CAPACITY": default}
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")  # the user's own setting wins
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setenv("POOLER_KERNEL_CACHE_CAPACITY", "300")
    assert bound_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "300",
                                     "LRU_CACHE_CAPACITY": "7"}


# One text per call, each of a token count not seen before: every call builds new kernels.
_SCRIPT = """
import json, sys
from pooler import Engine
from pooler.worker.memory import heap_in_use_mb
engine = Engine(sys.argv[1])
def call(words):
    engine.embed([" ".join(["memory"] * words)])
for words in range(8, 8 + 2 * 36, 2):   # warm-up: 36 new lengths fill the bounded caches
    call(words)                         # (a step builds 4 GEMM kernels: 32 lengths fit)
before = heap_in_use_mb()
for words in range(9, 9 + 2 * 24, 2):   # 24 more new lengths
    call(words)
print(json.dumps(heap_in_use_mb() - before))
"""


def _heap_growth_mb(model: str, env_extra: dict) -> float:
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    # Short single texts would take the C layer stack (pooler/kernels), which builds no oneDNN
    # kernels: keep every step on oneDNN, whose caches this test is about.
    env.update(env_extra, POOLER_CPU_KERNELS="0")
    out = subprocess.run([sys.executable, "-c", _SCRIPT, model], env=env, capture_output=True,
                         text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_new_step_sizes_keep_the_heap_flat(minilm_path):
    if memory.heap_in_use_mb() is None:
        pytest.skip("no glibc mallinfo2 here")
    bounded = _heap_growth_mb(str(minilm_path), {})
    # The libraries' own default: the cause of the soak's RSS growth (docs/dev/journal.md).
    unbounded = _heap_growth_mb(str(minilm_path), {"POOLER_KERNEL_CACHE_CAPACITY": "1024"})
    # Measured: bounded ~0 MB, unbounded ~55 MB (~2 MB per new length).
    assert bounded < 8, bounded
    assert unbounded > 25, unbounded
