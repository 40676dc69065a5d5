"""Threads per step: the configured count, or one for a step too small to gain from more.

A step of a few dozen tokens runs a handful of small GEMMs; splitting each across threads costs
a fork/join barrier per op, which is more than the work saved, and on a shared machine each
barrier waits for the slowest (possibly descheduled) thread. Measured on all-MiniLM-L6-v2
(docs/benchmarks.md, "Threads under contention"): below SINGLE_THREAD_BELOW_TOKENS tokens one
thread is as fast as two on a quiet machine and much faster on a busy one.
torch.set_num_threads is called only when the count changes (about SET_COST_US each).
"""
from __future__ import annotations

import torch

SINGLE_THREAD_BELOW_TOKENS = 64


class StepThreads:
    def __init__(self, num_threads: int, single_thread_below: int = SINGLE_THREAD_BELOW_TOKENS):
        self.num_threads = max(1, num_threads)
        self.single_thread_below = single_thread_below
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
