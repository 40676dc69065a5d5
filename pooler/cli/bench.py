"""`pooler bench`: pooler against the library a user would otherwise run, side by side."""
from __future__ import annotations

import json
import sys

from pooler.cli.common import add_engine_args


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark pooler against its peers side by side",
        description="Run each workload's sides (pooler, and the peer library) one after another "
        "in separate processes, on the same deterministic inputs and thread count, and print "
        "texts/s, real tokens/s, latency, peak RSS, the ratio to the peer and the share of the "
        "fp32 GEMM ceiling. With --quantization int8 the int8 engine runs as an extra side; with "
        "--dtype bfloat16 on the CPU a bf16 pooler side runs beside pooler fp32 (the peers stay "
        "fp32).")
    add_engine_args(p)
    from pooler.bench.shape_models import shape_names_line

    for action in p._actions:  # the bench's --model also takes a shape name
        if action.dest == "model":
            action.help += (f"; or a model shape the bench builds with seeded weights "
                            f"({shape_names_line()}; see --list), e.g. --model bert-base")
    p.add_argument("--workload", default="embed,single_query",
                   help="comma-separated workload names, or 'all' (see --list)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--quick", action="store_true",
                   help="tiny inputs: a smoke run that checks every side works, not a measurement")
    p.add_argument("--repeat", type=int, default=1, help="run every side this many times")
    p.add_argument("--corpus-size", type=int, default=None,
                   help="texts per side: the embed corpus (default 2000), the arch workload "
                   "(default 200), the lora workload (default 800); images per model for "
                   "image_embed (default 32); documents per length for long_context (default "
                   "max(2, 4096 / length))")
    p.add_argument("--corpus", default="mixed", choices=["mixed", "long", "passages"],
                   help="embed workload corpus: mixed (--corpus-size texts, half 5-15-word "
                   "queries, half 50-250-word passages), long (issue 30's mix: 300 texts of "
                   "5-15 words and 300 of 50-250 words) or passages (600 of 100-250 words)")
    p.add_argument("--archs", default=None,
                   help="arch workload: comma-separated architectures (mpnet, deberta-v3, "
                   "gemma3, bert, nomic, gte, jina-v3, eurobert; default "
                   "mpnet,deberta-v3,gemma3); long_context: modernbert-base, nomic, gte, "
                   "bge-m3, jina-v3 (default the first four)")
    p.add_argument("--lengths", default=None,
                   help="long_context workload: comma-separated document lengths in tokens "
                   "(default 1024,2048,4096,8192; --quick: 128)")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="also run every workload while N busy processes compete for the cores "
                        "(quiet and loaded runs interleaved in this one invocation, pooler and "
                        "its peer under the same load)")
    p.add_argument("--interleaved-rounds", type=int, default=None, metavar="N",
                   help="embed and single_query with --quantization int8 or --dtype bfloat16 "
                   "(CPU): also time that variant against pooler fp32 in one process, N "
                   "alternating rounds (default 3, 1 with --quick; 0: skip), for a ratio that "
                   "drift between "
                   "sides run one after another cannot skew; image_embed: its rounds of "
                   "pooler, transformers and sentence-transformers (default 3)")
    p.add_argument("--json", default=None, help="also write the raw results to this file")
    p.add_argument("--markdown", default=None, help="also write the tables to this file")
    p.add_argument("--chart", default=None,
                   help="also draw a PNG chart (needs matplotlib: pip install 'pooler[bench]')")
    p.set_defaults(func=run)


def run(args) -> int:
    from pooler.bench.peers import bench_install_command, check_chart_support, missing_peers
    from pooler.bench.registry import BenchOptions, load_workloads
    from pooler.bench.runner import (contention_lines, format_table, latency_lines,
                                     pooler_ratio_lines, report_to_dict, run_benchmarks,
                                     summary_lines, write_chart)
    from pooler.bench.shape_models import SHAPE_MODELS, resolve_bench_model
    from pooler.cpu_threads import available_cpus

    workloads = load_workloads()
    if args.list:
        for name, w in sorted(workloads.items()):
            print(f"{name:14s} {w.description}")
        print("\nmodel shapes for --model (seeded weights, built once under the bench cache; "
              "--quick builds a tiny variant):")
        for name, shape in SHAPE_MODELS.items():
            print(f"{name:14s} {shape.description}")
        return 0
    names = sorted(workloads) if args.workload == "all" else \
        [n.strip() for n in args.workload.split(",") if n.strip()]
    unknown = [n for n in names if n not in workloads]
    if unknown:
        raise ValueError(f"--workload: unknown {unknown}; choose from {sorted(workloads)} "
                         "or 'all'.")
    if args.chart:  # before any work: the chart is drawn after the whole run
        check_chart_support()
    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1.")
    if args.interleaved_rounds is not None and args.interleaved_rounds < 0:
        raise ValueError("--interleaved-rounds must be 0 or more.")
    if args.background_load < 0:
        raise ValueError("--background-load must be 0 or more.")
    if args.runner not in ("auto", "native") or args.task is not None:
        raise ValueError("pooler bench runs the native runner with each workload's own task; "
                         "drop --runner/--task.")
    device = "cuda" if args.device == "cuda" else "cpu"
    model = resolve_bench_model(args.model, tiny=args.quick)  # a shape name: built here once
    opts = BenchOptions(model=model, threads=args.threads or available_cpus(),
                        quick=args.quick, device=device, dtype=args.dtype,
                        quantization=args.quantization,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs,
                        extra={"corpus_size": args.corpus_size, "corpus": args.corpus,
                               "interleaved_rounds": args.interleaved_rounds,
                               "archs": [a.strip() for a in args.archs.split(",") if a.strip()]
                               if args.archs else None,
                               "lengths": _int_list(args.lengths, "--lengths")})
    loads = (0, args.background_load) if args.background_load else (0,)
    report = run_benchmarks(names, opts, repeat=args.repeat, loads=loads)
    out = []
    out.extend(summary_lines(report))
    out.extend(contention_lines(report))
    for i, bench_run in enumerate(report.runs, 1):
        out.append("")
        out.append(f"run {i} of {len(report.runs)} ({bench_run.label}):")
        out.append(format_table(bench_run.rows))
        out.extend(pooler_ratio_lines(bench_run.rows))
        out.extend(latency_lines(bench_run.rows))
    missing = missing_peers()
    if missing and any(row.skipped for r in report.runs for row in r.rows):
        out.extend(["", f"skipped: the sides that need {', '.join(missing)} (not installed); "
                        f"install every peer with: {bench_install_command()}"])
    print("\n".join(out))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(f"- {line}" for line in summary_lines(report)
                               + contention_lines(report)) + "\n")
            for i, bench_run in enumerate(report.runs, 1):
                f.write(f"\nRun {i} of {len(report.runs)} ({bench_run.label}):\n\n"
                        f"{format_table(bench_run.rows, markdown=True)}\n")
                ratios = pooler_ratio_lines(bench_run.rows) + latency_lines(bench_run.rows)
                if ratios:
                    f.write("\n" + "\n".join(f"- {line}" for line in ratios) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report_to_dict(report), f, indent=1)
    if args.chart:
        write_chart(report, args.chart)
        print(f"chart: {args.chart}", file=sys.stderr)
    return 0


def _int_list(value: str | None, flag: str) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag}: give comma-separated integers, e.g. 1024,8192 "
                         f"(got {value!r}).") from None
