"""Never slower because of an option: a requested precision (int8, bfloat16) is timed against
fp32 at load, on the step shapes the engine will run, and kept only where it wins on this CPU.

Why at load and not from a table of CPU flags: the flags say which instructions exist, not
whether torch/oneDNN/our kernels use them well for these shapes (on an AVX2-only Zen 3,
`torch._int_mm` ran 37x slower than the fp32 GEMM it was meant to beat). A few forward passes
per shape (tens of milliseconds on a small encoder) settle it on the machine itself.

What happens when the candidate is not faster is the caller's `on_slower` policy:
- "fallback" (default): run fp32 and log one line naming the CPU, its features and the timings.
  A user who asked for speed gets the fastest path there is, and is told why.
- "refuse": raise ValueError with the same facts (for deployments that must not silently change
  numerics, e.g. an index built with int8 embeddings), also where the candidate lost only some
  step sizes: it never serves a mix of precisions.
Where the caller can run each range of step sizes at its own precision (ShapeCase.size_range:
an int8 BERT-family model runs short steps on a C stack of its own, pooler/worker/
precision_check.py), each range is decided alone: the candidate runs the ranges where it is not
slower, fp32 the others, and one warning line says which and why ("fallback").
- "off": skip the check and run what was asked (parity tests, memory-bound deployments).
"""
from __future__ import annotations

import enum
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from pooler.cpu_features import CpuFeatures, cpu_features

log = logging.getLogger(__name__)

OnSlower = Literal["fallback", "refuse", "off"]
ON_SLOWER_CHOICES: tuple[str, ...] = ("fallback", "refuse", "off")


@dataclass(frozen=True)
class ShapeCase:
    """One step shape to time: a name for the log ("1x12 tokens", "8x128 tokens") and the two
    forward passes to compare, each a no-argument callable that runs one step. size_range: the
    range of step sizes the shape stands for ("short steps", "large steps"), where the caller
    can run each range at its own precision; "" (every case): one choice for every step."""
    name: str
    candidate: Callable[[], object]
    fp32: Callable[[], object]
    size_range: str = ""


class Outcome(enum.Enum):
    """How a decision came about; callers branch on this, never on the reason's wording."""
    CHECK_OFF = "check off"          # on_slower="off": run as requested, nothing timed
    FASTER = "faster"                # not slower on any shape: the candidate everywhere
    PER_RANGE = "per step size"      # won some size ranges, lost others (already logged)
    SLOWER = "slower"                # lost: fp32 instead (already logged)
    UNSUPPORTED = "unsupported"      # no path on this CPU: fp32 instead (already logged)


@dataclass(frozen=True)
class PrecisionDecision:
    requested: str                 # "int8", "bfloat16"
    outcome: Outcome
    reason: str                    # one line for the log / the error
    # (case name, candidate seconds, fp32 seconds) per timed shape; empty when not timed
    timings: tuple[tuple[str, float, float], ...] = field(default_factory=tuple)
    # (size range, candidate kept there) per ShapeCase.size_range, in the cases' order; empty
    # when the cases named no ranges (then use_candidate holds for every step)
    ranges: tuple[tuple[str, bool], ...] = field(default_factory=tuple)

    @property
    def use_candidate(self) -> bool:
        """Whether the requested precision runs (for every step, or per `ranges`); False:
        fp32 instead."""
        return self.outcome in (Outcome.CHECK_OFF, Outcome.FASTER, Outcome.PER_RANGE)

    def candidate_for(self, size_range: str) -> bool:
        """Whether steps of `size_range` run the requested precision."""
        return dict(self.ranges).get(size_range, self.use_candidate)

    @property
    def precision(self) -> str:
        """What the engine runs: the requested precision or "float32"."""
        return self.requested if self.use_candidate else "float32"


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of `repeats` calls after `warmup` untimed ones (first calls pack
    weights and warm caches)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(candidate: Callable[[], object], fp32: Callable[[], object],
                        rounds: int = 4, warmup: int = 1,
                        statistic: Callable[[list[float]], float] = statistics.median
                        ) -> tuple[float, float]:
    """Median wall times of the two sides, timed alternately (A B, B A, A B, ...) after
    `warmup` untimed calls of each. Timing one side after the other let whichever ran first
    absorb the machine's drift right after a load (the clock ramping up, a neighbour's job):
    on a quiet Zen 4 the int8 engine's short step, the very fp32 C stack the fp32 side runs,
    came out 20% slower in four loads out of four and sent the whole engine back to fp32.
    `statistic` (default the median) reduces each side's round times: `min` keeps each side's
    least disturbed round, for two sides that run the same amount of work (a neighbour's job
    only ever adds time)."""
    for _ in range(warmup):
        candidate()
        fp32()
    times: dict[int, list[float]] = {0: [], 1: []}
    for r in range(rounds):
        order = ((0, candidate), (1, fp32)) if r % 2 == 0 else ((1, fp32), (0, candidate))
        for side, fn in order:
            start = time.perf_counter()
            fn()
            times[side].append(time.perf_counter() - start)
    return statistic(times[0]), statistic(times[1])


# A case counts as slower only beyond this share of the fp32 time: a case where both sides run
# the same code (int8's short steps take the fp32 C stack) must not flip on timing noise.
NOISE_MARGIN = 0.05


def decide(requested: str, cases: Sequence[ShapeCase], *, on_slower: OnSlower = "fallback",
           cpu: CpuFeatures | None = None, supported: bool = True, unsupported_why: str = "",
           measure: Callable[[Callable[[], object]], float] | None = None,
           measure_pair: Callable[[Callable[[], object], Callable[[], object]],
                                  tuple[float, float]] = interleaved_medians,
           margin: float = NOISE_MARGIN) -> PrecisionDecision:
    """Keep `requested` only if it is supported here and not slower than fp32 (beyond
    `margin`) on every case; where the cases name size ranges, per range (see the module
    docstring).

    `supported=False` (with `unsupported_why`) short-cuts the timing: the path cannot run on
    this CPU at all. Each case's two sides are timed together by `measure_pair(candidate,
    fp32) -> (seconds, seconds)` (default: alternately, interleaved_medians), or each alone by
    `measure(fn) -> seconds` when given; both are replaceable so the rule is unit-tested with
    fake timings."""
    if on_slower not in ON_SLOWER_CHOICES:
        raise ValueError(f"on_slower must be one of {ON_SLOWER_CHOICES}, got {on_slower!r}.")
    cpu = cpu or cpu_features()
    if on_slower == "off":
        return PrecisionDecision(requested, Outcome.CHECK_OFF,
                                 f"{requested}: check off, run as requested")
    where = f"this CPU, {cpu.summary()}"
    if not supported:
        reason = f"{requested} has no path on {where}: {unsupported_why}"
        return _settle(requested, Outcome.UNSUPPORTED, reason, (), on_slower)
    if measure is not None:
        measure_pair = lambda candidate, fp32: (measure(candidate), measure(fp32))  # noqa: E731
    timings = tuple((c.name, *measure_pair(c.candidate, c.fp32)) for c in cases)
    slower = [(n, a, b) for n, a, b in timings if a > b * (1 + margin)]
    shown = ", ".join(f"{n}: {a * 1e3:.2f} vs {b * 1e3:.2f} ms" for n, a, b in timings)
    slower_names = {n for n, _, _ in slower}
    names = list(dict.fromkeys(c.size_range for c in cases))
    ranges = tuple((r, not any(c.name in slower_names for c in cases if c.size_range == r))
                   for r in names) if any(names) else ()
    if not slower:
        return PrecisionDecision(requested, Outcome.FASTER,
                                 f"{requested} faster than float32 on {where} ({shown})",
                                 timings, ranges)
    if ranges and any(won for _, won in ranges) and on_slower != "refuse":
        # a range the candidate lost runs fp32, the others the candidate (never a path slower
        # than fp32 at a size); "refuse" never mixes: it raises below, naming the sizes
        chosen = "; ".join(f"{r}: {requested if won else 'float32'}" for r, won in ranges)
        reason = (f"{requested} per step size on {where}: {chosen} ({shown}; {requested} vs "
                  f"float32)")
        log.warning("%s.", reason)
        return PrecisionDecision(requested, Outcome.PER_RANGE, reason, timings, ranges)
    reason = (f"{requested} is slower than float32 on {where} ({shown}; {requested} vs "
              f"float32)")
    return _settle(requested, Outcome.SLOWER, reason, timings, on_slower,
                   tuple((r, False) for r, _ in ranges))


def _settle(requested: str, outcome: Outcome, reason: str, timings, on_slower: OnSlower,
            ranges: tuple[tuple[str, bool], ...] = ()) -> PrecisionDecision:
    if on_slower == "refuse":
        raise ValueError(f"{reason}. Drop the {requested} option to run float32, or pass "
                         f"on_slower='off' (CLI: --precision-check off) to run {requested} "
                         f"anyway.")
    log.warning("%s; running float32 instead (on_slower='refuse' makes this an error, 'off' "
                "runs %s anyway).", reason, requested)
    return PrecisionDecision(requested, outcome, reason, timings, ranges)
