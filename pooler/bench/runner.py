"""Run workloads side by side (one subprocess per side) and turn the results into a table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pooler.bench.background_load import background_load
from pooler.bench.machine import machine_info, measure_gemm_gflops
from pooler.bench.peers import (MissingPeer, bench_install_command, missing_module,
                                missing_peers)
from pooler.bench.registry import (BenchOptions, SideResult, Workload, get_workload,
                                   load_workloads)


@dataclass
class Row:
    """One side of one workload, with everything the table shows."""
    workload: str
    side: str
    role: str
    texts_per_s: float
    tokens_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    peak_rss_mb: float
    loaded_rss_mb: float
    ratio: float | None          # vs the workload's baseline (texts/s, or p50 for latency)
    ceiling_pct: float | None    # tokens/s as a share of the GEMM-bound ceiling
    cos_min: float | None        # outputs vs the baseline's (see _match: cosine, or set F1)
    cos_mean: float | None
    note: str = ""
    error: str | None = None
    skipped: bool = False        # the workload cannot run here; `error` says why
    path: str = ""               # a pooler side's precision path (SideResult.precision_path)
    interleaved_vs_fp32: list[float] = field(default_factory=list)  # per round, see SideResult
    phases_s: dict[str, float] = field(default_factory=dict)  # see SideResult
    model_flops: float = 0.0
    rounds_per_s: list[float] = field(default_factory=list)
    seconds: float = 0.0         # the timed part's wall time (SideResult.seconds)
    # model_flops over the "model" phase alone, as a share of the GEMM ceiling
    model_ceiling_pct: float | None = None
    p90_ms: float | None = None
    step_paths: dict[str, str] = field(default_factory=dict)  # see SideResult


@dataclass
class BenchRun:
    rows: list[Row] = field(default_factory=list)
    ceilings: dict[str, float] = field(default_factory=dict)  # workload -> tokens/s ceiling
    background_load: int = 0     # busy processes competing for the cores during this run

    @property
    def label(self) -> str:
        return (f"{self.background_load} busy background processes"
                if self.background_load else "no background load")


@dataclass
class BenchReport:
    options: BenchOptions
    machine: dict
    gemm_gflops: list[float]     # measured before the runs and after them
    flops_per_token: dict[str, float]
    runs: list[BenchRun]
    loadavg_after: list[float] = field(default_factory=list)
    # measured by each side with a ceiling column, next to its timed part (side.py)
    side_gemm_gflops: list[float] = field(default_factory=list)

    @property
    def fastest_gemm(self) -> float:
        """The GEMM rate every share of the ceiling is taken against: the fastest measured in
        the invocation, so a measurement slowed by a neighbour never inflates a share."""
        return max(self.gemm_gflops + self.side_gemm_gflops)


def run_side(workload: Workload, side: str, opts: BenchOptions) -> SideResult:
    """Run one side in a fresh interpreter with the thread count fixed in its environment."""
    return run_side_results(workload, side, opts)[0]


def run_side_results(workload: Workload, side: str, opts: BenchOptions) -> list[SideResult]:
    """run_side, keeping every result of a side that times several libraries in one process
    (image_embed): one per library."""
    env = dict(os.environ)
    threads = str(opts.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="true")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pooler.bench.side", workload.name, side,
             json.dumps(opts.to_dict()), result_path],
            env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            module = missing_module(proc.stderr or proc.stdout)
            if module is not None:
                raise MissingPeer(module)
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(" | ".join(tail) or f"exit code {proc.returncode}")
        with open(result_path) as f:
            data = json.load(f)
        return [SideResult(**d) for d in (data if isinstance(data, list) else [data])]
    finally:
        os.unlink(result_path)


def _match(a_file: str | None, b_file: str | None) -> tuple[float | None, float | None]:
    """(min, mean) over inputs of how well a side's outputs match the baseline's: cosine of
    each output vector (.npy rows), or F1 of each input's set of items (.json lists, e.g. NER
    entities as [label, start, end]; 1.0 when both sets are empty)."""
    if not a_file or not b_file or Path(a_file).suffix != Path(b_file).suffix:
        return None, None
    if a_file.endswith(".json"):
        a, b = json.loads(Path(a_file).read_text()), json.loads(Path(b_file).read_text())
        if len(a) != len(b):
            return None, None
        scores = []
        for x, y in zip(a, b):
            x, y = {tuple(i) for i in x}, {tuple(i) for i in y}
            scores.append(1.0 if not x and not y else 2 * len(x & y) / (len(x) + len(y)))
        return (min(scores), float(np.mean(scores))) if scores else (None, None)
    a, b = np.load(a_file), np.load(b_file)
    if a.shape != b.shape:
        return None, None
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    cos = (a * b).sum(axis=1)
    return float(cos.min()), float(cos.mean())


def _rows(workload: Workload, results: list[SideResult], errors: dict[str, str],
          ceiling: float | None, gemm_gflops: float | None = None) -> list[Row]:
    errors = {**errors, **{r.side: r.error for r in results if r.error}}
    results = [r for r in results if not r.error]
    by_side = {r.side: r for r in results}
    rows = []
    for r in results:
        base = by_side.get(workload.baseline_of(r.side))
        texts_per_s = r.texts / r.seconds if r.seconds else 0.0
        tokens_per_s = r.tokens / r.seconds if r.seconds else 0.0
        p50 = float(np.percentile(r.latencies_ms, 50)) if r.latencies_ms else None
        p99 = float(np.percentile(r.latencies_ms, 99)) if r.latencies_ms else None
        p90 = float(np.percentile(r.latencies_ms, 90)) if r.latencies_ms else None
        ratio = None
        if base is not None and base.seconds:
            if workload.metric == "latency" and p50 and base.latencies_ms:
                ratio = p50 / float(np.percentile(base.latencies_ms, 50))
            elif workload.metric == "throughput":
                ratio = texts_per_s / (base.texts / base.seconds)
        cos_min, cos_mean = _match(r.outputs_file, base.outputs_file if base else None)
        ceiling_pct = 100 * tokens_per_s / ceiling if ceiling else None
        model_pct = None
        if ceiling_pct is None and r.model_flops and r.seconds and gemm_gflops:
            ceiling_pct = 100 * r.model_flops / r.seconds / (gemm_gflops * 1e9)
            if r.phases_s.get("model"):
                model_pct = 100 * r.model_flops / r.phases_s["model"] / (gemm_gflops * 1e9)
        rows.append(Row(workload.name, r.side, r.role, texts_per_s, tokens_per_s, p50, p99,
                        r.peak_rss_mb, r.loaded_rss_mb, ratio, ceiling_pct,
                        cos_min, cos_mean, r.note, path=r.precision_path,
                        interleaved_vs_fp32=list(r.interleaved_vs_fp32),
                        phases_s=dict(r.phases_s), model_flops=r.model_flops,
                        rounds_per_s=list(r.rounds_per_s), seconds=r.seconds,
                        model_ceiling_pct=model_pct, p90_ms=p90,
                        step_paths=dict(r.step_paths)))
    for side, error in errors.items():
        rows.append(Row(workload.name, side, "?", 0, 0, None, None, 0, 0, None, None, None, None,
                        error=error))
    return rows


def run_benchmarks(names: list[str], opts: BenchOptions, repeat: int = 1,
                   log=lambda msg: print(msg, file=sys.stderr),
                   loads: tuple[int, ...] = (0,)) -> BenchReport:
    """Each repeat runs every workload once per entry of `loads` (busy background processes,
    0 = none), so quiet and loaded figures come from one invocation, interleaved."""
    workloads = [get_workload(n) for n in names]
    missing = missing_peers()
    if missing:
        log(f"not installed: {', '.join(missing)}; the sides that need them are skipped. "
            f"Install every peer with: {bench_install_command()}")
    machine = machine_info()
    gemm = [measure_gemm_gflops(opts.threads)]
    log(f"fp32 GEMM 2048^3 at {opts.threads} threads (the faster of torch matmul and oneDNN): "
        f"{gemm[0]:.0f} GFLOP/s")
    # The ceiling is the CPU's fp32 GEMM rate: on a GPU run it would mean nothing.
    flops = {w.name: w.flops_per_token(opts) for w in workloads
             if w.flops_per_token and not (w.skip and w.skip(opts)) and opts.device == "cpu"}
    runs, side_gemm = [], []
    for index in range(repeat):
        for load in loads:
            tag = f"run {index + 1}/{repeat}" + (f", background load {load}" if load else "")
            with background_load(load):
                runs.append(_run_workloads(workloads, opts, flops, gemm[0], tag, log, load,
                                           side_gemm))
    gemm.append(measure_gemm_gflops(opts.threads))
    report = BenchReport(opts, machine, gemm, flops, runs, [round(x, 2) for x in os.getloadavg()],
                         side_gemm)
    _shares_against(report.runs, used=gemm[0], fastest=report.fastest_gemm)
    return report


def _shares_against(runs: list[BenchRun], used: float, fastest: float) -> None:
    """Rows were built against the GEMM rate measured first (`used`); restate every share of the
    ceiling against `fastest` (a share scales as 1 / the rate)."""
    scale = used / fastest
    for run in runs:
        run.ceilings = {name: c / scale for name, c in run.ceilings.items()}
        for row in run.rows:
            if row.ceiling_pct is not None:
                row.ceiling_pct *= scale
            if row.model_ceiling_pct is not None:
                row.model_ceiling_pct *= scale


def _run_workloads(workloads: list[Workload], opts: BenchOptions, flops: dict[str, float],
                   gemm_gflops: float, tag: str, log, load: int,
                   side_gemm: list[float] | None = None) -> BenchRun:
    run = BenchRun(background_load=load)
    with tempfile.TemporaryDirectory(prefix="pooler-bench-") as out_dir:
        for workload in workloads:
            run_opts = BenchOptions(**{**opts.to_dict(), "out_dir": out_dir})
            reason = workload.skip(run_opts) if workload.skip else None
            if reason:
                log(f"[{tag}] {workload.name}: skipped: {reason}")
                run.rows.append(Row(workload.name, "-", "?", 0, 0, None, None, 0, 0, None,
                                    None, None, None, error=reason, skipped=True))
                continue
            results, errors, skipped = [], {}, {}
            sides = workload.sides(run_opts)
            for side in sides:
                if side.skip:
                    log(f"[{tag}] {workload.name}: {side.name}: skipped: {side.skip}")
                    skipped[side.name] = side.skip
                    continue
                log(f"[{tag}] {workload.name}: {side.name} ...")
                try:
                    side_results = run_side_results(workload, side.name, run_opts)
                    results.extend(side_results)
                    if side_gemm is not None:
                        side_gemm.extend(g for r in side_results for g in r.gemm_gflops)
                    # Logged as each side ends, so an interrupted run still leaves numbers.
                    for result in side_results:
                        if result.error:
                            log(f"  {result.side}: failed: {result.error}")
                            continue
                        p50 = f", p50 {np.percentile(result.latencies_ms, 50):.2f} ms" \
                            if result.latencies_ms else ""
                        who = f"{result.side}: " if len(side_results) > 1 else ""
                        log(f"  {who}{result.texts / result.seconds:.1f} texts/s, "
                            f"{result.tokens / result.seconds:.0f} tokens/s{p50}, "
                            f"peak RSS {result.peak_rss_mb:.0f} MB")
                except MissingPeer as exc:
                    skipped[side.name] = str(exc)
                    log(f"  skipped: {exc}")
                except RuntimeError as exc:
                    errors[side.name] = str(exc)
                    log(f"  failed: {exc}")
            ceiling = gemm_gflops * 1e9 / flops[workload.name] if workload.name in flops \
                else None
            if ceiling:
                run.ceilings[workload.name] = ceiling
            rows = _rows(workload, results, errors, ceiling, gemm_gflops) + [
                Row(workload.name, side, "?", 0, 0, None, None, 0, 0, None, None, None, None,
                    error=reason, skipped=True) for side, reason in skipped.items()]
            order = {side.name: i for i, side in enumerate(sides)}
            run.rows.extend(sorted(rows, key=lambda r: order.get(r.side, len(order))))
    return run


def contention_lines(report: BenchReport) -> list[str]:
    """Loaded vs quiet, per side, from runs of the same invocation: the side's own slowdown
    (p50 for latency workloads, texts/s for throughput) and its ratio to the peer in each."""
    quiet = [r for r in report.runs if not r.background_load]
    loaded = [r for r in report.runs if r.background_load]
    if not quiet or not loaded:
        return []

    def by_key(runs):
        table: dict[tuple[str, str], list[Row]] = {}
        for run in runs:
            for row in run.rows:
                if not row.error:
                    table.setdefault((row.workload, row.side), []).append(row)
        return table

    q, l = by_key(quiet), by_key(loaded)
    lines = [f"contention ({loaded[0].background_load} busy processes vs none; medians over "
             "runs):"]
    for key in q:
        if key not in l:
            continue
        latency = q[key][0].p50_ms is not None
        value = (lambda r: r.p50_ms) if latency else (lambda r: r.texts_per_s)
        qv = float(np.median([value(r) for r in q[key]]))
        lv = float(np.median([value(r) for r in l[key]]))
        ratios = [float(np.median([r.ratio for r in rows if r.ratio is not None] or [np.nan]))
                  for rows in (q[key], l[key])]
        what = (f"p50 {qv:.2f} -> {lv:.2f} ms ({lv / qv:.2f}x)" if latency else
                f"{qv:.1f} -> {lv:.1f} texts/s ({lv / qv:.2f}x)")
        vs = "" if any(np.isnan(ratios)) else \
            f"; vs baseline {ratios[0]:.2f}x quiet, {ratios[1]:.2f}x loaded"
        lines.append(f"  {key[0]} / {key[1]}: {what}{vs}")
    return lines


# ---- rendering ----------------------------------------------------------------------------
_HEADERS = ["workload", "side", "texts/s", "tokens/s", "p50 ms", "p90 ms", "p99 ms",
            "RSS MB loaded/peak",
            "vs baseline", "% ceiling", "match min / mean", "note", "path"]


def _cells(row: Row) -> list[str]:
    def f(x, fmt):
        return "" if x is None else format(x, fmt)
    if row.error:
        status = "SKIPPED" if row.skipped else "FAILED"
        return [row.workload, row.side, status, "", "", "", "", "", "", "", "", row.error[:100],
                ""]
    cos = "" if row.cos_min is None else f"{row.cos_min:.6f} / {row.cos_mean:.6f}"
    return [row.workload, row.side, f(row.texts_per_s, ".1f"), f(row.tokens_per_s, ".0f"),
            f(row.p50_ms, ".2f"), f(row.p90_ms, ".2f"), f(row.p99_ms, ".2f"),
            f"{row.loaded_rss_mb:.0f} / {row.peak_rss_mb:.0f}",
            "" if row.ratio is None else f"{row.ratio:.2f}x", f(row.ceiling_pct, ".0f"),
            cos, row.note, row.path]


def format_table(rows: list[Row], markdown: bool = False) -> str:
    body = [_cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(_HEADERS) + " |", "|" + "---|" * len(_HEADERS)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(_HEADERS)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa
    return "\n".join([fmt(_HEADERS), fmt(["-" * w for w in widths])] + [fmt(c) for c in body])


def summary_lines(report: BenchReport) -> list[str]:
    m, o = report.machine, report.options
    lines = [f"machine: {m['cpu']} ({m['cpu_kind']}: {m['cpu_flags']}), {m['cores']} cores; "
             f"threads {o.threads}; load average before {m['loadavg']}, after "
             f"{report.loadavg_after}",
             "precision paths on this CPU: " + "; ".join(
                 f"{name}: {path}" for name, path in m.get("precision_paths", {}).items()),
             f"versions: python {m['python']}, torch {m['torch']}, transformers "
             f"{m['transformers']}, sentence-transformers {m['sentence-transformers']}, "
             f"tokenizers {m['tokenizers']}",
             "fp32 GEMM (2048^3, best of 5, faster of torch matmul / oneDNN): "
             + ", ".join(f"{g:.0f}" for g in report.gemm_gflops) + " GFLOP/s (before, after)"
             + (f"; in the sides' processes {min(report.side_gemm_gflops):.0f}-"
                f"{max(report.side_gemm_gflops):.0f}" if report.side_gemm_gflops else "")
             + f"; shares of the ceiling use the fastest, {report.fastest_gemm:.0f}"]
    for name, fpt in report.flops_per_token.items():
        ceiling = report.fastest_gemm * 1e9 / fpt
        lines.append(f"{name}: {fpt / 1e6:.1f} MFLOP per real token -> fp32 ceiling "
                     f"{ceiling:.0f} tokens/s")
    lines.append("vs baseline: texts/s ratio for throughput workloads, p50 ratio for latency "
                 "workloads (lower is faster); match: cosine of each output vs the baseline's "
                 "(NER: F1 of each text's entity set)")
    return lines


# Issue 44's target for one query on a quiet machine: p99 within this factor of p50.
TAIL_TARGET = 1.5


def latency_lines(rows: list[Row]) -> list[str]:
    """Per side of a latency workload: the tail (p99 / p50, against TAIL_TARGET), and for
    pooler sides the path each step size takes (SideResult.step_paths)."""
    lines = []
    for r in rows:
        if r.error or r.p50_ms is None or not r.p99_ms:
            continue
        tail = r.p99_ms / r.p50_ms
        where = "within" if tail <= TAIL_TARGET else "above"
        line = f"{r.workload} / {r.side}: p99/p50 {tail:.2f} ({where} the {TAIL_TARGET}x target)"
        if r.step_paths:
            line += "; step paths: " + ", ".join(f"{size} -> {path}"
                                                 for size, path in r.step_paths.items())
        lines.append(line)
    return lines


def pooler_ratio_lines(rows: list[Row]) -> list[str]:
    """Each pooler variant side ("pooler int8", "pooler int8 avx2", with a workload's shape
    suffix such as "1x100") against plain fp32 "pooler" of the same workload and shape, in the
    sense of the "vs baseline" column (texts/s ratio; p50 ratio for latency workloads). An
    interleaved side (embed's "pooler int8 interleaved") reports its own per-round ratios,
    measured against fp32 in alternating rounds in one process, where the other sides' ratio
    divides two runs made one after another (drift on a shared machine lands on one of them)."""
    def is_pooler(side: str) -> bool:  # a skipped row's side is "-"
        return side.replace("-", " ").split()[:1] == ["pooler"]

    def split(side: str) -> tuple[str, str]:  # -> (variant, shape suffix)
        words = side.replace("-", " ").split()[1:]  # results are named "pooler-int8"
        shape = " ".join(w for w in words if w[0].isdigit())
        return " ".join(w for w in words if not w[0].isdigit()), shape

    plain = {(r.workload, split(r.side)[1]): r for r in rows
             if is_pooler(r.side) and not split(r.side)[0]}
    lines = []
    for r in rows:
        variant, shape = split(r.side)
        # an AVX2 side's own fp32 rounds ran the AVX2 build; the plain fp32 side, the best one
        fp32 = "pooler (fp32{})".format(
            "" if "avx2" not in variant.split() else
            ", AVX2 build too" if r.interleaved_vs_fp32 else ", this CPU's best build")
        if r.interleaved_vs_fp32:  # timed against fp32 in its own process: steadier
            rounds = ", ".join(f"{x:.2f}" for x in r.interleaved_vs_fp32)
            lines.append(f"{r.workload}: {r.side} vs {fp32}, alternating rounds in one "
                         f"process {float(np.median(r.interleaved_vs_fp32)):.2f}x "
                         f"(median; rounds {rounds})")
            continue
        base = plain.get((r.workload, shape))
        if not is_pooler(r.side) or not variant or base is None or not r.ratio \
                or not base.ratio:
            continue
        lines.append(f"{r.workload}: {r.side} vs {fp32} {r.ratio / base.ratio:.2f}x")
    for name in dict.fromkeys(r.workload for r in rows):  # a workload's own lines
        workload = load_workloads().get(name)
        if workload is not None and workload.report_lines:
            lines.extend(workload.report_lines([r for r in rows if r.workload == name]))
    return lines


def report_to_dict(report: BenchReport) -> dict:
    from dataclasses import asdict
    return asdict(report)


def write_chart(report: BenchReport, path: str | Path) -> None:
    """One panel per workload: texts/s (throughput) or calls/s at p50 (latency) per side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in report.runs[0].rows))
    ncols = min(4, len(workloads))
    nrows = -(-len(workloads) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[len(workloads):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, workloads):
        latency = get_workload(name).metric == "latency"
        by_side: dict[str, list[float]] = {}
        for run in report.runs:
            for r in run.rows:
                if r.workload == name and not r.error and r.texts_per_s:
                    value = 1e3 / r.p50_ms if latency and r.p50_ms else r.texts_per_s
                    by_side.setdefault(r.side, []).append(value)
        sides = list(by_side)
        means = [float(np.mean(by_side[s])) for s in sides]
        colors = ["#2b7bba" if s.startswith("pooler") else "#999999" for s in sides]
        bars = ax.bar(range(len(sides)), means, color=colors)
        for bar, side in zip(bars, sides):
            for value in by_side[side]:  # every run as a dot: shows the noise
                ax.plot(bar.get_x() + bar.get_width() / 2, value, "k.", markersize=4)
        ax.set_xticks(range(len(sides)), sides, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("queries/s at p50 (1 / latency)" if latency else "texts/s")
        ax.set_title(name, fontsize=10)
    fig.suptitle(f"pooler vs peer, {report.options.threads} threads, {report.machine['cpu']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
