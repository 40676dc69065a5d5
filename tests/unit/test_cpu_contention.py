"""The contention detector (run-queue wait vs run time, hysteresis, flap back-off) and the
per-step thread decision it drives, on fake schedstat readings."""
from __future__ import annotations

import pytest

from pooler.cpu_contention import ContentionDetector, SampledContention, read_schedstat
from pooler.worker.step_threads import StepThreads

MS = 1_000_000


class FakeSchedstat:
    """Cumulative (run ns, wait ns) totals advanced one sample at a time."""

    def __init__(self):
        self.run = self.wait = 0

    def step(self, run_ms: float, wait_ms: float) -> tuple[int, int]:
        self.run += int(run_ms * MS)
        self.wait += int(wait_ms * MS)
        return self.run, self.wait


def feed(detector, stat, samples):
    """samples: (run ms, wait ms) pairs; returns the state after each."""
    return [detector.update(*stat.step(r, w)) for r, w in samples]


def test_switches_to_contended_and_back_with_hysteresis():
    det, stat = ContentionDetector(hold=2), FakeSchedstat()
    det.update(*stat.step(0, 0))  # first reading is the baseline
    # One contended sample is not enough; two in a row are.
    assert feed(det, stat, [(50, 40), (50, 2), (50, 40), (50, 40)]) == \
        [False, False, False, True]
    # Between exit (0.1) and enter (0.3) ratios the state is kept; two quiet samples leave it.
    assert feed(det, stat, [(50, 10), (50, 10), (50, 1), (50, 1)]) == [True, True, True, False]
    assert det.last_ratio == pytest.approx(0.02)


def test_idle_engine_samples_accumulate_instead_of_deciding():
    det, stat = ContentionDetector(hold=1, min_run_ns=20 * MS), FakeSchedstat()
    det.update(*stat.step(0, 0))
    # 5 ms of run time per sample: not evidence yet; the fourth makes 20 ms with 16 ms waited.
    assert feed(det, stat, [(5, 4), (5, 4), (5, 4)]) == [False, False, False]
    assert det.last_ratio is None
    assert feed(det, stat, [(5, 4)]) == [True]
    assert det.last_ratio == pytest.approx(0.8)


def test_flapping_doubles_the_quiet_samples_needed_to_leave():
    det, stat = ContentionDetector(hold=2, flap_samples=10, max_exit_hold=8), FakeSchedstat()
    det.update(*stat.step(0, 0))
    busy, quiet = (50, 40), (50, 0)
    assert feed(det, stat, [busy, busy]) == [False, True]
    assert feed(det, stat, [quiet, quiet]) == [True, False]  # base exit hold: 2
    # Contention comes straight back (one neighbour, two cores): exit now needs 4 samples.
    assert feed(det, stat, [busy, busy]) == [False, True]
    assert det.exit_hold == 4
    assert feed(det, stat, [quiet] * 4) == [True, True, True, False]
    assert feed(det, stat, [busy, busy]) == [False, True]
    assert det.exit_hold == 8
    assert feed(det, stat, [quiet] * 8)[-2:] == [True, False]
    assert feed(det, stat, [busy, busy])[-1] is True
    assert det.exit_hold == 8  # capped
    # Long quiet after leaving forgets the flaps.
    feed(det, stat, [quiet] * 8)
    assert det.contended is False
    feed(det, stat, [quiet] * 11)
    assert det.exit_hold == 0
    assert feed(det, stat, [busy, busy]) == [False, True]
    assert feed(det, stat, [quiet, quiet]) == [True, False]


def test_sampled_contention_reads_at_most_once_per_interval():
    stat, now, reads = FakeSchedstat(), [0.0], []

    def read():
        reads.append(now[0])
        return stat.step(50, 40)

    sampled = SampledContention(ContentionDetector(hold=1), interval_s=0.2, read=read,
                                clock=lambda: now[0])
    assert sampled.contended() is False  # baseline
    assert sampled.contended() is False and len(reads) == 1  # same instant: no new read
    now[0] = 0.25
    assert sampled.contended() is True and len(reads) == 2


def test_missing_schedstat_never_reports_contention():
    sampled = SampledContention(read=lambda: None)
    assert sampled.contended() is False


def test_read_schedstat_sums_threads_and_skips_broken_ones(tmp_path):
    for tid, text in (("10", "100 40 3\n"), ("11", "200 60 5\n"), ("12", "garbage\n")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(text)
    (tmp_path / "13").mkdir()  # a thread that exited: no file
    assert read_schedstat(tmp_path) == (300, 100)
    assert read_schedstat(tmp_path / "missing") is None


def test_real_schedstat_counts_our_run_time():
    before = read_schedstat()
    if before is None:
        pytest.skip("no schedstat on this kernel")
    sum(i * i for i in range(200_000))
    after = read_schedstat()
    assert after[0] > before[0] and after[1] >= before[1]


class FlagContention:
    def __init__(self):
        self.value = False
        self.asked = 0

    def contended(self):
        self.asked += 1
        return self.value


def test_fewer_threads_only_while_contended():
    flag = FlagContention()
    threads = StepThreads(2, single_thread_below=0, contended_single_thread_below=256,
                          contention=flag)
    assert threads.threads_for(10) == 2 and threads.threads_for(2000) == 2
    flag.value = True
    assert threads.threads_for(10) == 1 and threads.threads_for(255) == 1
    assert threads.threads_for(256) == 1 and threads.threads_for(2000) == 1  # half of 2
    flag.value = False
    assert threads.threads_for(10) == 2 and threads.threads_for(2000) == 2


def test_large_steps_keep_half_the_threads_while_contended():
    flag = FlagContention()
    flag.value = True
    threads = StepThreads(8, 0, 256, contention=flag)
    assert threads.threads_for(12) == 1 and threads.threads_for(4096) == 4
    assert StepThreads(3, 0, 256, contention=flag).threads_for(4096) == 1


def test_thread_decision_follows_the_detector_through_a_busy_spell():
    stat, now = FakeSchedstat(), [0.0]
    load = {"wait_per_run": 0.0}

    def read():
        return stat.step(50, 50 * load["wait_per_run"])

    contention = SampledContention(ContentionDetector(hold=2), interval_s=0.1, read=read,
                                   clock=lambda: now[0])
    threads = StepThreads(2, single_thread_below=0, contended_single_thread_below=256,
                          contention=contention)

    def steps(n):
        out = []
        for _ in range(n):
            now[0] += 0.1
            out.append(threads.threads_for(12))
        return out

    assert steps(4) == [2, 2, 2, 2]
    load["wait_per_run"] = 1.0  # neighbours wake up
    assert steps(3) == [2, 1, 1]
    load["wait_per_run"] = 0.2  # in the dead band: stay on one thread
    assert steps(5) == [1] * 5
    load["wait_per_run"] = 0.0  # they leave
    assert steps(3) == [1, 2, 2]


def test_no_contention_sampling_with_one_thread_or_the_rule_off():
    flag = FlagContention()
    StepThreads(1, 0, 256, contention=flag).threads_for(4)
    StepThreads(2, 0, 0, contention=flag).threads_for(4)
    assert flag.asked == 0


def test_the_contended_rule_is_on_by_default_for_short_steps(monkeypatch):
    monkeypatch.delenv("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS", raising=False)
    flag = FlagContention()
    flag.value = True
    threads = StepThreads(2, 0, contention=flag)
    assert threads.threads_for(255) == 1 and StepThreads(4, 0, contention=flag).threads_for(256) == 2
    flag.value = False
    assert threads.threads_for(12) == 2


def test_contended_threshold_env_is_checked(monkeypatch):
    monkeypatch.setenv("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS", "0")
    flag = FlagContention()
    flag.value = True
    assert StepThreads(2, 0, contention=flag).threads_for(1) == 2
    monkeypatch.setenv("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS", "lots")
    with pytest.raises(ValueError, match="POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS"):
        StepThreads(2)
