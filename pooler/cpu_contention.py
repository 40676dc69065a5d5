"""Is this process fighting other processes for its cores right now? A cheap, smoothed answer.

The signal is the kernel's own account of our threads (/proc/self/task/*/schedstat): time spent
running, and time spent runnable but waiting on a run queue for a core. On a machine with spare
cores the wait is a few percent of the run time; when other processes want the same cores it
grows to a large share of it (2 busy processes on 2 cores against our 2 threads: about as long
as the run time). Load average would also see it, but it is a 1-minute average over the whole
host (not our CPUs, not our cgroup) and counts tasks that never compete with us.

Reading the files costs ~10 us per thread, so the detector samples at most every
`interval_s` seconds, not every step. Hysteresis (a higher ratio to enter the contended state
than to leave it, and `hold` samples in a row before either change) keeps it from flapping on
one noisy sample.

Imports nothing heavy (no torch).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TASK_DIR = Path("/proc/self/task")


def read_schedstat(task_dir: Path = TASK_DIR) -> tuple[int, int] | None:
    """(run ns, run-queue wait ns) summed over this process's threads, or None where the kernel
    has no schedstat (not Linux, or CONFIG_SCHED_INFO off)."""
    run = wait = 0
    found = False
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    for tid in tids:
        try:
            fields = (task_dir / tid / "schedstat").read_text().split()
            run += int(fields[0])
            wait += int(fields[1])
            found = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that exited between listdir and read
    return (run, wait) if found else None


@dataclass
class ContentionDetector:
    """Feed it (run ns, wait ns) totals; it says whether the cores are contended.

    enter_ratio / exit_ratio: run-queue wait per unit of run time over one sample that counts
    as contended / as quiet (between them the state is kept). min_run_ns: a sample with less run
    time than this (an idle engine) is merged into the next one instead of deciding anything.
    hold: samples in a row that must agree before the state changes.

    Flapping: with one busy neighbour on two cores, our two threads wait (contended), one
    thread does not (quiet), and back. So leaving the contended state needs `exit_hold` quiet
    samples, doubled (up to max_exit_hold) each time contention returns within
    `flap_samples` samples of leaving it, and reset after that many quiet samples in a row."""
    enter_ratio: float = 0.3
    exit_ratio: float = 0.1
    min_run_ns: int = 20_000_000
    hold: int = 2
    max_exit_hold: int = 64
    flap_samples: int = 50
    contended: bool = False
    last_ratio: float | None = None
    exit_hold: int = 0  # 0: `hold`
    _base: tuple[int, int] | None = None
    _streak: int = 0
    _since_exit: int | None = None

    def update(self, run_ns: int, wait_ns: int) -> bool:
        if self._base is None:
            self._base = (run_ns, wait_ns)
            return self.contended
        run, wait = run_ns - self._base[0], wait_ns - self._base[1]
        if run < self.min_run_ns:
            return self.contended  # too little evidence yet: keep accumulating
        self._base = (run_ns, wait_ns)
        ratio = max(0, wait) / run
        self.last_ratio = ratio
        if self.contended:
            self._streak = self._streak + 1 if ratio < self.exit_ratio else 0
            if self._streak >= (self.exit_hold or self.hold):
                self.contended, self._streak, self._since_exit = False, 0, 0
        else:
            if self._since_exit is not None:
                self._since_exit += 1
            self._streak = self._streak + 1 if ratio >= self.enter_ratio else 0
            if self._streak >= self.hold:
                if self._since_exit is not None and self._since_exit <= self.flap_samples:
                    self.exit_hold = min(self.max_exit_hold, 2 * (self.exit_hold or self.hold))
                self.contended, self._streak, self._since_exit = True, 0, None
            elif self._since_exit is not None and self._since_exit > self.flap_samples:
                self.exit_hold, self._since_exit = 0, None  # quiet for long: forget the flaps
        return self.contended


class SampledContention:
    """A ContentionDetector fed from schedstat at most every interval_s seconds (a step between
    samples reuses the last answer). Always False where schedstat is missing."""

    def __init__(self, detector: ContentionDetector | None = None, interval_s: float = 0.2,
                 read: Callable[[], tuple[int, int] | None] = read_schedstat,
                 clock: Callable[[], float] = time.monotonic):
        self.detector = detector or ContentionDetector()
        self.interval_s = interval_s
        self._read = read
        self._clock = clock
        self._next = float("-inf")

    def contended(self) -> bool:
        now = self._clock()
        if now >= self._next:
            self._next = now + self.interval_s
            sample = self._read()
            if sample is not None:
                self.detector.update(*sample)
        return self.detector.contended
