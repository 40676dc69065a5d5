"""One short query at 2 threads and at 1 thread, alternating query by query in one process, with
no extra load and with N busy processes (each in its own session, like `pooler bench
--background-load`); also our threads' run-queue wait per unit of run time, the signal
pooler/cpu_contention.py reads. Prints one line per load.

    flock /work/notes/bench.lock .venv/bin/python benchmarks/threads_under_contention.py 0,1,2,4
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import pooler  # noqa: E402,F401  (sets the OpenMP spin before torch loads, as the CLI does)
from pooler.bench import corpus  # noqa: E402
from pooler.bench.background_load import background_load  # noqa: E402
from pooler.cpu_contention import read_schedstat  # noqa: E402
from pooler.engine.llm import Engine  # noqa: E402


def main(loads: list[int], num_queries: int = 100) -> None:
    engine = Engine(num_threads=2)
    step_threads = engine.core.model_runner.step_threads
    step_threads.contended_single_thread_below = 0  # fixed counts here, not the rule
    queries = corpus.queries(num_queries, seed=7)
    for query in queries[:10]:
        engine.embed(query)
    for load in loads:
        with background_load(load):
            latency = {2: [], 1: []}
            wait_per_run = {2: [], 1: []}
            for query in queries:
                for threads in (2, 1):
                    step_threads.num_threads = threads
                    engine.embed("warm " + query[:5])  # the count is set; caches touched
                    run0, wait0 = read_schedstat()
                    start = time.perf_counter()
                    engine.embed(query)
                    latency[threads].append((time.perf_counter() - start) * 1e3)
                    run1, wait1 = read_schedstat()
                    wait_per_run[threads].append((wait1 - wait0) / max(1, run1 - run0))
            print(f"load {load}: " + " | ".join(
                f"{t} thread(s) p50 {statistics.median(latency[t]):.2f} ms, wait/run "
                f"{statistics.median(wait_per_run[t]):.2f}" for t in (2, 1))
                + f" | loadavg {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "0,2,4").split(",")])
