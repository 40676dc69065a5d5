"""Threads per step: the configured count, or (opt-in) one thread for a small step while other
processes compete for the cores.

DEFAULT OFF. The end-to-end A/B decided it: `pooler bench --workload single_query
--background-load 2`, same machine, back to back (load ~12 from other sessions), the sides
inheriting POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS: 0 (rule off, 2 threads): p50 11.48 ->
9.81 ms with the load (0.85x); 256 (rule on): 11.23 -> 24.78 ms (2.21x). The in-process A/B
below favoured one thread, the real bench did not; the bench wins. The detector and the rule
stay for setups where a measurement says they help (set the variable to e.g. 256).

The idea: with OMP_WAIT_POLICY=PASSIVE an idle OpenMP thread sleeps, and every parallel loop must
wake it; on a busy machine the woken thread waits on a run queue for a core (milliseconds) while
the caller waits at the loop's barrier. A short query runs a few hundred such loops, each too
small to gain from a second thread anyway. One thread has no barrier to wait at. Large steps
keep every thread: their loops are long enough for the split to pay even under load.

Measured (docs/benchmarks.md, "Threads under contention"; 2 cores, all-MiniLM-L6-v2, one
process, 1 and 2 threads alternating query by query, busy neighbours in their own sessions):
one short query p50 2 threads / 1 thread: 24.0 / 21.5 ms with other sessions' load alone
(machine load ~8), 35.6 / 32.7 ms with 2 extra busy processes, 43.9 / 34.0 ms with 4; corpus
batches (40 texts): 14.4 / 13.7 texts/s with 2 extra busy processes. On an idle machine the
2-thread step stays (the detector reports no contention). With the rule on, `pooler bench
--workload single_query,embed --background-load 2` gave single-query p50 10.5 -> 20.2 ms
(1.93x), corpus 1.31x sentence-transformers quiet and loaded; then the A/B above.

Caveat: the neighbours above are other sessions/cgroups, which the kernel gives a share as a
whole. Busy threads in the SAME scheduling group (same session under autogroup, same cgroup)
share CPU time per runnable thread instead, and there one thread loses share (4 spinners in our
session: 61.5 ms at 1 thread vs 29.7 ms at 2); the default (off) keeps every
thread in that setup.

Contention is measured, not guessed (pooler/cpu_contention.py): run-queue wait per unit of run
time of our threads, sampled at most every 0.2 s, with hysteresis. Knobs:
POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS (default 0 = off; 256 covers short queries) and
POOLER_SINGLE_THREAD_BELOW_TOKENS (one thread below this size always; default 0 = off).
torch.set_num_threads costs ~0.1 us and is called only when the count changes.
"""
from __future__ import annotations

import os

import torch

from pooler.cpu_contention import SampledContention

# Off by default: `pooler bench` said so (docstring above).
DEFAULT_CONTENDED_SINGLE_THREAD_BELOW = 0


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
