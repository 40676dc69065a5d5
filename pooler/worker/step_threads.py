"""Threads per step: the configured count, or one for a step below a token threshold.

The idea: a step of a few tokens runs small GEMMs whose fork/join barrier may cost more than
splitting saves. Measured here it did not hold (docs/benchmarks.md, "Threads under
contention"): with OMP_WAIT_POLICY=PASSIVE, one short query (~10 tokens, all-MiniLM-L6-v2) on a
2-core machine at load average ~13 took p50 7.9 ms at 2 threads and 62-67 ms at 1 thread, and
no batch size from 8 to 512 tokens ran faster on one thread. A busy machine shares CPU time per
runnable thread, so a single-threaded step gets less of it. The threshold therefore defaults to
0 (never drop to one thread); POOLER_SINGLE_THREAD_BELOW_TOKENS sets one where a measurement
says it helps. torch.set_num_threads costs ~0.1 us, and is called only when the count changes.
"""
from __future__ import annotations

import os

import torch


def single_thread_below_tokens() -> int:
    value = os.environ.get("POOLER_SINGLE_THREAD_BELOW_TOKENS", "0")
    if not value.isdigit():
        raise ValueError("POOLER_SINGLE_THREAD_BELOW_TOKENS must be a non-negative integer, "
                         f"got {value!r}.")
    return int(value)


class StepThreads:
    def __init__(self, num_threads: int, single_thread_below: int | None = None):
        self.num_threads = max(1, num_threads)
        self.single_thread_below = single_thread_below_tokens() \
            if single_thread_below is None else single_thread_below
        self._current = None

    def threads_for(self, num_tokens: int) -> int:
        return 1 if num_tokens < self.single_thread_below else self.num_threads

    def apply(self, num_tokens: int) -> int:
        """Set torch's intra-op threads for a step of num_tokens tokens; returns the count."""
        threads = self.threads_for(num_tokens)
        if threads != self._current or torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            self._current = threads
        return threads
