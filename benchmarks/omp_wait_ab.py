"""One short query under OpenMP wait settings and the step-thread contention rule, quiet and with
N busy processes in their own sessions (as `pooler bench --background-load` starts them).

    python benchmarks/omp_wait_ab.py [--rounds 3] [--load 2]

One fresh process per setting per round (OpenMP reads its settings once, when torch loads),
settings interleaved within each round so drift on a shared machine hits them alike; each
embeds 130 short queries (pooler/bench/corpus.py, seed 7) one call at a time after 20 warm-ups,
all-MiniLM-L6-v2, 2 threads. Prints p50 / p90 per round and the median p50 per setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pooler.bench.background_load import background_load  # noqa: E402

_CHILD = r'''
import os, statistics, time
import numpy as np
from pooler import Engine
from pooler.bench.corpus import queries
engine = Engine("sentence-transformers/all-MiniLM-L6-v2", num_threads=int(os.environ["THREADS"]))
texts = queries(150, seed=7)
for text in texts[:20]:
    engine.embed(text, use_tqdm=False)
ms = []
for text in texts[20:]:
    start = time.perf_counter()
    engine.embed(text, use_tqdm=False)
    ms.append((time.perf_counter() - start) * 1e3)
print(statistics.median(ms), float(np.percentile(ms, 90)))
'''

_RULE = "POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS"
SETTINGS = {
    "PASSIVE, rule off": {"OMP_WAIT_POLICY": "PASSIVE", _RULE: "0"},
    # libgomp's own default when neither variable is set (spelled out: `import pooler` would
    # otherwise set its short spin).
    "libgomp default spin (300000), rule off": {"GOMP_SPINCOUNT": "300000", _RULE: "0"},
    "GOMP_SPINCOUNT=10000, rule off": {"GOMP_SPINCOUNT": "10000", _RULE: "0"},
    "GOMP_SPINCOUNT=10000, rule on (default)": {"GOMP_SPINCOUNT": "10000"},
    "1 thread": {"THREADS": "1"},
}


def run(extra: dict) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", _RULE)}
    env.update({"THREADS": "2", "HF_HUB_OFFLINE": "1"}, **extra)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=2, help="busy processes in the loaded half")
    args = parser.parse_args()
    p50s: dict[tuple[int, str], list[float]] = {}
    for load in (0, args.load):
        with background_load(load):
            for round_ in range(args.rounds):
                for name, extra in SETTINGS.items():
                    p50, p90 = run(extra)
                    p50s.setdefault((load, name), []).append(p50)
                    print(f"load {load} round {round_ + 1} {name}: p50 {p50:.2f} p90 {p90:.2f} "
                          f"ms (load average {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\n| setting | quiet p50 | {args.load} busy processes p50 | loaded / quiet |")
    print("|---|---|---|---|")
    for name in SETTINGS:
        quiet = statistics.median(p50s[(0, name)])
        loaded = statistics.median(p50s[(args.load, name)])
        print(f"| {name} | {quiet:.2f} ms | {loaded:.2f} ms | {loaded / quiet:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
