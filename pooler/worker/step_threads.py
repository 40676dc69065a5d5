"""Threads per step: the configured count, or one thread for a small step while other processes
compete for the cores.

ON by default for steps below 256 tokens (short queries; a corpus batch keeps every thread).
On a 2-core machine, all-MiniLM-L6-v2, 2 threads, one short query p50 over 130 queries, three
rounds, 2 busy processes in their own sessions as the loaded case (`python
benchmarks/omp_wait_ab.py`, docs/benchmarks.md "OpenMP spin and the contention rule"):

| setting                          | quiet   | loaded   |
|----------------------------------|---------|----------|
| GOMP_SPINCOUNT=10000, rule off   | 5.74 ms | 19.50 ms |
| GOMP_SPINCOUNT=10000, rule on    | 5.06 ms |  7.53 ms |
| OMP_WAIT_POLICY=PASSIVE, rule off| 8.08 ms | 23.26 ms |

Why: a short query runs a few hundred parallel loops, each too small to gain much from a second
thread. When another process holds a core, our second thread waits on a run queue and the
caller waits for it at every loop's barrier. One thread has no barrier to wait at. Large steps
keep every thread: their loops are long enough for the split to pay even under load (corpus
batches of 40 texts: 14.4 texts/s on 2 threads vs 13.7 on one with 2 busy neighbours).

An earlier A/B (docs/benchmarks.md, "Threads under contention") put the rule off: with
OMP_WAIT_POLICY=PASSIVE, on a machine other sessions kept at load ~12, it made that p50 worse
(11.2 -> 24.8 ms). There the "quiet" half was itself contended and every wake-up went through
the kernel; on a quiet machine with the short spin the rule wins both halves (table above).

Caveat: busy threads in the SAME scheduling group (same session under autogroup, same cgroup)
share CPU time per runnable thread instead, and there one thread loses share (4 spinners in our
session: 61.5 ms at 1 thread vs 29.7 ms at 2). Set POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS=0
to keep every thread in such a setup.

Contention is measured, not guessed (pooler/cpu_contention.py): run-queue wait per unit of run
time of our threads, sampled at most every 0.2 s, with hysteresis. Knobs:
POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS (default 256; 0 = off) and
POOLER_SINGLE_THREAD_BELOW_TOKENS (one thread below this size always; default 0 = off).
torch.set_num_threads costs ~0.1 us and is called only when the count changes.
"""
from __future__ import annotations

import os

import torch

from pooler.cpu_contention import SampledContention

# Short queries go to one thread under contention (docstring above); 0 turns the rule off.
DEFAULT_CONTENDED_SINGLE_THREAD_BELOW = 256


def _tokens_env(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    if not value.isdigit():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    return int(value)


def single_thread_below_tokens() -> int:
    return _tokens_env("POOLER_SINGLE_THREAD_BELOW_TOKENS", 0)


def contended_single_thread_below_tokens() -> int:
    return _tokens_env("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS",
                       DEFAULT_CONTENDED_SINGLE_THREAD_BELOW)


class StepThreads:
    def __init__(self, num_threads: int, single_thread_below: int | None = None,
                 contended_single_thread_below: int | None = None,
                 contention: SampledContention | None = None):
        self.num_threads = max(1, num_threads)
        self.single_thread_below = single_thread_below_tokens() \
            if single_thread_below is None else single_thread_below
        self.contended_single_thread_below = contended_single_thread_below_tokens() \
            if contended_single_thread_below is None else contended_single_thread_below
        self.contention = contention or SampledContention()
        self._current = None

    def threads_for(self, num_tokens: int) -> int:
        if self.num_threads == 1 or num_tokens < self.single_thread_below:
            return 1
        # Only sample contention when the answer could change the count (cheap either way).
        if num_tokens < self.contended_single_thread_below and self.contention.contended():
            return 1
        return self.num_threads

    def apply(self, num_tokens: int) -> int:
        """Set torch's intra-op threads for a step of num_tokens tokens; returns the count."""
        threads = self.threads_for(num_tokens)
        if threads != self._current or torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            self._current = threads
        return threads
