"""One short query at a time: pooler at an older commit vs this checkout vs ONNX Runtime fp32,
interleaved in rounds (a fresh process per side per round, so drift on a shared machine hits
every side alike):
    .venv/bin/python benchmarks/single_query_ab.py --old COMMIT [--threads 1] [--rounds 5]
Each side embeds the 200 single_query texts (pooler/bench/corpus.py, seed 7) one call at a time
after 20 warm-up calls, tokenization included. Prints each side's p50 per round and the median
of those, with the load average. The old commit is unpacked with `git archive` into a temporary
folder and imported from there (PYTHONPATH) with this venv's packages.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_REPO = Path(__file__).resolve().parent.parent


def measure(side: str, threads: int, clock: str) -> list[float]:
    """Runs inside the side's process: per-call latencies in ms."""
    now = time.thread_time if clock == "thread" else time.perf_counter
    from pooler.bench import corpus

    texts = corpus.queries(200, seed=7)
    if side == "ort":
        from pooler.bench.onnx_peer import FP32_FILE, OrtEmbedder
        from pooler.model_folder import DEFAULT_MODEL, resolve_model_path

        model = OrtEmbedder(resolve_model_path(DEFAULT_MODEL), FP32_FILE, threads)
        call = lambda text: model.encode([text])[0]  # noqa: E731
    else:
        from pooler.engine.llm import Engine
        from pooler.model_folder import DEFAULT_MODEL

        engine = Engine(DEFAULT_MODEL, num_threads=threads)
        call = lambda text: engine.embed(text)[0].embedding  # noqa: E731
    for text in texts[:20]:
        call(text)
    latencies = []
    for text in texts:
        start = now()
        call(text)
        latencies.append((now() - start) * 1e3)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="git commit of the 'before' pooler")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall",
                        help="thread: CPU time of the calling thread (meaningful at --threads 1 "
                        "only: it leaves out time the process waited for a core on a busy "
                        "machine)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: run one side
    args = parser.parse_args()
    if args.side:
        print(json.dumps(measure(args.side, args.threads, args.clock)))
        return 0
    # The OpenMP spin this checkout's `import pooler` sets (pooler/cpu_threads.py), for every
    # side alike (an older pooler may set none), unless the caller's environment chose one.
    from pooler.cpu_threads import prefer_short_openmp_spin

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    prefer_short_openmp_spin(env)
    with tempfile.TemporaryDirectory(prefix="pooler-old-") as old_dir:
        archive = subprocess.run(["git", "-C", str(_REPO), "archive", args.old],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_dir], input=archive, check=True)
        sides = {f"pooler {args.old[:8]}": {"PYTHONPATH": old_dir},
                 "pooler this checkout": {"PYTHONPATH": str(_REPO)},
                 "ort fp32": {"PYTHONPATH": str(_REPO)}}
        p50s: dict[str, list[float]] = {name: [] for name in sides}
        print(f"threads {args.threads}, {args.clock} clock; load average before "
              f"{os.getloadavg()}")
        for round_ in range(args.rounds):
            for name, extra in sides.items():
                side = "ort" if name.startswith("ort") else "pooler"
                out = subprocess.run(
                    [sys.executable, __file__, "--old", args.old, "--threads",
                     str(args.threads), "--clock", args.clock, "--side", side], env={**env, **extra}, cwd="/",
                    capture_output=True, text=True, check=True).stdout
                p50 = float(np.percentile(json.loads(out.strip().splitlines()[-1]), 50))
                p50s[name].append(p50)
                print(f"round {round_ + 1} {name}: p50 {p50:.2f} ms "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"load average after {os.getloadavg()}")
        for name, values in p50s.items():
            print(f"{name:24s} median p50 over rounds {np.median(values):.2f} ms "
                  f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
