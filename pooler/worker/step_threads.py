"""Threads per step: the configured count, or fewer while other processes compete for the cores:
one thread for a small step (below 256 tokens: short queries), half the threads (at least one)
for a larger one.

Measured on a 2-core machine, all-MiniLM-L6-v2, 2 threads, 2 busy processes in their own
sessions as the loaded case (docs/dev/journal.md, "OpenMP spin and the contention rule"):
- one short query, p50 over 130 queries, median of three rounds (`python
  benchmarks/omp_wait_ab.py`): GOMP_SPINCOUNT=10000 with the rule off 4.69 ms quiet, 21.16 ms
  loaded; with the rule on 5.34 / 10.18 ms (one thread alone: 6.35 / 9.82 ms;
  OMP_WAIT_POLICY=PASSIVE, rule off: 8.73 / 15.36 ms).
- 300 corpus texts, texts/s, median of two rounds (`python benchmarks/corpus_threads_ab.py`):
  rule off 81.3 quiet, 21.8 loaded; rule on 80.6 / 24.5 (sentence-transformers b32 in the
  same environment: 53.4 / 15.0).

Why: a parallel loop ends at a barrier where every thread waits for the slowest. When another
process holds a core, our second thread waits on a run queue and the caller waits for it at
every barrier; a short query runs a few hundred such loops, each too small to gain much from
a second thread anyway. Fewer threads than free cores have no peer to wait for.

An earlier A/B (docs/dev/journal.md, "Threads under contention") put the rule off: with
OMP_WAIT_POLICY=PASSIVE, on a machine other sessions kept at load ~12, it made that p50 worse
(11.2 -> 24.8 ms). There the "quiet" half was itself contended and every wake-up went through
the kernel; on a quiet machine with the short spin the rule wins the loaded half and leaves the
quiet one alone (the detector stays quiet there: all 220 steps of a quiet run kept 2 threads).

Caveat: busy threads in the SAME scheduling group (same session under autogroup, same cgroup)
share CPU time per runnable thread instead, and there one thread loses share (4 spinners in our
session: 61.5 ms at 1 thread vs 29.7 ms at 2). Set POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS=0
to keep every thread in such a setup. Halving for larger steps is measured on 2 cores only.

Contention is measured, not guessed (pooler/cpu_contention.py): run-queue wait per unit of run
time of our threads, sampled at most every 0.2 s, with hysteresis. Knobs:
POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS (default 256; 0 turns the whole rule off) and
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
        # A threshold of 0 turns the rule off: no sampling, every thread.
        if self.contended_single_thread_below and self.contention.contended():
            if num_tokens < self.contended_single_thread_below:
                return 1
            return max(1, self.num_threads // 2)  # larger steps: half the threads
        return self.num_threads

    def apply(self, num_tokens: int) -> int:
        """Set torch's intra-op threads for a step of num_tokens tokens; returns the count."""
        threads = self.threads_for(num_tokens)
        if threads != self._current or torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            self._current = threads
        return threads
