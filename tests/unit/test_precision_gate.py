"""pooler/precision_gate.py: a requested precision is kept only where it is not slower than fp32,
decided from timings (faked here) on every step shape."""
import logging

import pytest

from pooler import precision_gate as gate
from pooler.cpu_features import CpuFeatures

AVX2 = CpuFeatures(model="AMD EPYC 7R13", arch="x86_64", flags=frozenset({"avx2", "fma"}))


def _cases(*names):
    return [gate.ShapeCase(n, candidate=lambda n=n: ("cand", n), fp32=lambda n=n: ("fp32", n))
            for n in names]


def _fake(times):
    """measure() that returns times[(which, case)] for the callable's (which, case) result."""
    return lambda fn: times[fn()]


def test_kept_when_faster_on_every_shape():
    d = gate.decide("int8", _cases("1x12", "8x128"), cpu=AVX2, measure=_fake({
        ("cand", "1x12"): 0.002, ("fp32", "1x12"): 0.004,
        ("cand", "8x128"): 0.010, ("fp32", "8x128"): 0.020}))
    assert d.use_candidate and d.precision == "int8"
    assert [t[0] for t in d.timings] == ["1x12", "8x128"]


def test_falls_back_with_one_log_line_when_slower_on_any_shape(caplog):
    with caplog.at_level(logging.WARNING, logger="pooler.precision_gate"):
        d = gate.decide("int8", _cases("1x12", "8x128"), cpu=AVX2, measure=_fake({
            ("cand", "1x12"): 0.080, ("fp32", "1x12"): 0.005,
            ("cand", "8x128"): 0.010, ("fp32", "8x128"): 0.020}))
    assert not d.use_candidate and d.precision == "float32"
    [record] = caplog.records
    assert "avx2" in record.message and "AVX2" in record.message   # names the CPU's features
    assert "80.00 vs 5.00 ms" in record.message and "float32 instead" in record.message


def test_refuses_when_the_user_insists():
    with pytest.raises(ValueError, match=r"bfloat16 is slower than float32.*--precision-check"):
        gate.decide("bfloat16", _cases("1x12"), cpu=AVX2, on_slower="refuse",
                    measure=_fake({("cand", "1x12"): 0.02, ("fp32", "1x12"): 0.01}))


def test_unsupported_is_decided_without_timing():
    def never(fn):
        raise AssertionError("must not time an unsupported path")
    d = gate.decide("bfloat16", _cases("1x12"), cpu=AVX2, supported=False,
                    unsupported_why="no AVX512_BF16 or AMX", measure=never)
    assert not d.use_candidate and "no AVX512_BF16 or AMX" in d.reason


def test_off_runs_what_was_asked_without_timing():
    d = gate.decide("int8", _cases("1x12"), cpu=AVX2, on_slower="off",
                    measure=lambda fn: pytest.fail("timed"))
    assert d.use_candidate and d.timings == ()


def test_bad_policy_names_the_choices():
    with pytest.raises(ValueError, match="fallback.*refuse.*off"):
        gate.decide("int8", _cases("1x12"), cpu=AVX2, on_slower="always")


def test_median_seconds_times_the_callable():
    calls = []
    assert gate.median_seconds(lambda: calls.append(1), repeats=3, warmup=2) >= 0
    assert len(calls) == 5


def test_fastest_rounds_ignore_a_neighbours_burst_on_one_side(monkeypatch):
    """Two sides of 60 and 66 ms (the second 10% slower) while a neighbour's job adds 30 ms to
    the faster side's calls in two of three rounds: their medians put it slower, each side's
    fastest round (statistic=min, the layer-stack check's) keeps the true order."""
    clock = {"now": 0.0, "calls": 0}
    burst_calls = {3, 4}  # the fast side's calls in rounds 1 and 2 (calls: A B, B A, A B)

    def side(cost: float):
        def run():
            clock["now"] += cost + (0.030 if clock["calls"] in burst_calls else 0.0)
            clock["calls"] += 1
        return run
    monkeypatch.setattr(gate.time, "perf_counter", lambda: clock["now"])
    fast, slow = side(0.060), side(0.066)
    medians = gate.interleaved_medians(fast, slow, rounds=3, warmup=0)
    assert medians[0] > medians[1]
    clock.update(now=0.0, calls=0)
    best = gate.interleaved_medians(fast, slow, rounds=3, warmup=0, statistic=min)
    assert best == pytest.approx((0.060, 0.066))


def test_interleaved_timing_cancels_a_drift_that_sequential_timing_pins_on_one_side(monkeypatch):
    """Two sides running the same code while the machine speeds up after a load (each call
    10% faster than the one before, down to a floor): timed one after the other, the first side
    looks far slower; timed alternately, the two medians agree within the noise margin."""
    clock = {"now": 0.0, "cost": 0.010}

    def same_code():
        clock["now"] += clock["cost"]
        clock["cost"] = max(0.002, clock["cost"] * 0.9)
    monkeypatch.setattr(gate.time, "perf_counter", lambda: clock["now"])

    sequential = gate.median_seconds(same_code, repeats=4), gate.median_seconds(same_code, 4)
    assert sequential[0] > sequential[1] * (1 + gate.NOISE_MARGIN)
    clock["cost"] = 0.010
    cand, fp32 = gate.interleaved_medians(same_code, same_code, rounds=4)
    assert abs(cand - fp32) <= gate.NOISE_MARGIN * fp32
    d = gate.decide("int8", _cases("1x12"), cpu=AVX2)  # default: interleaved, real calls
    assert d.use_candidate and len(d.timings) == 1


def _ranged(*pairs):
    return [gate.ShapeCase(n, candidate=lambda n=n: ("cand", n), fp32=lambda n=n: ("fp32", n),
                           size_range=r) for n, r in pairs]


SIZED = (("1x12", "short"), ("4x12", "short"), ("16x128", "large"))


def test_each_size_range_is_decided_alone(caplog):
    times = {("cand", "1x12"): 0.004, ("fp32", "1x12"): 0.002,  # int8 loses one short shape
             ("cand", "4x12"): 0.004, ("fp32", "4x12"): 0.008,
             ("cand", "16x128"): 0.05, ("fp32", "16x128"): 0.1}
    with caplog.at_level(logging.WARNING):
        d = gate.decide("int8", _ranged(*SIZED), cpu=AVX2, measure=_fake(times))
    assert d.use_candidate and d.ranges == (("short", False), ("large", True))
    assert not d.candidate_for("short") and d.candidate_for("large")
    [line] = [r.message for r in caplog.records]
    assert "short: float32" in line and "large: int8" in line and "1x12: 4.00 vs 2.00" in line
    # every range won: int8 everywhere, one info-level reason
    times[("cand", "1x12")] = 0.001
    d = gate.decide("int8", _ranged(*SIZED), cpu=AVX2, measure=_fake(times))
    assert d.ranges == (("short", True), ("large", True)) and d.outcome is gate.Outcome.FASTER
    assert d.reason.startswith("int8 faster")  # the log line's wording
    # every range lost: fp32 for all, as without ranges
    slow = {k: (0.5 if k[0] == "cand" else 0.001) for k in times}
    d = gate.decide("int8", _ranged(*SIZED), cpu=AVX2, measure=_fake(slow))
    assert not d.use_candidate and d.ranges == (("short", False), ("large", False))
    assert d.outcome is gate.Outcome.SLOWER


def test_refuse_never_mixes_precisions():
    times = {("cand", "1x12"): 0.004, ("fp32", "1x12"): 0.002,
             ("cand", "4x12"): 0.001, ("fp32", "4x12"): 0.002,
             ("cand", "16x128"): 0.05, ("fp32", "16x128"): 0.1}
    with pytest.raises(ValueError, match="slower than float32.*1x12"):
        gate.decide("int8", _ranged(*SIZED), cpu=AVX2, on_slower="refuse",
                    measure=_fake(times))


def test_outcome_says_how_each_decision_came_about():
    """Callers branch on `outcome` (precision_check logs only FASTER: the others warned), and
    use_candidate follows from it."""
    times = {("cand", "1x12"): 0.004, ("fp32", "1x12"): 0.002,
             ("cand", "4x12"): 0.001, ("fp32", "4x12"): 0.002,
             ("cand", "16x128"): 0.05, ("fp32", "16x128"): 0.1}
    faster = {k: (0.001 if k[0] == "cand" else 0.002) for k in times}
    cases = {
        gate.Outcome.CHECK_OFF: gate.decide("int8", _cases("1x12"), cpu=AVX2, on_slower="off"),
        gate.Outcome.FASTER: gate.decide("int8", _ranged(*SIZED), cpu=AVX2,
                                         measure=_fake(faster)),
        gate.Outcome.PER_RANGE: gate.decide("int8", _ranged(*SIZED), cpu=AVX2,
                                            measure=_fake(times)),
        gate.Outcome.SLOWER: gate.decide("int8", _cases("1x12"), cpu=AVX2,
                                         measure=_fake(times)),
        gate.Outcome.UNSUPPORTED: gate.decide("bfloat16", _cases("1x12"), cpu=AVX2,
                                              supported=False, unsupported_why="no AMX"),
    }
    assert {o: d.outcome for o, d in cases.items()} == {o: o for o in cases}
    assert {o for o, d in cases.items() if d.use_candidate} == {
        gate.Outcome.CHECK_OFF, gate.Outcome.FASTER, gate.Outcome.PER_RANGE}
