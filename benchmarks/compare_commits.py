"""Two copies of the pooler package side by side: one short query p50 and corpus texts/s, one
process per run, alternating A, B, A, B, with no extra load and with N busy processes in their
own sessions. Same settings for both (the OpenMP spin `import pooler` sets, default threads).

    git archive 3e26372 pooler | tar -x -C /tmp/main_code
    flock /work/notes/bench.lock .venv/bin/python benchmarks/compare_commits.py \\
        /tmp/main_code . --loads 0,2 --repeat 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pooler.bench.background_load import background_load  # noqa: E402
from pooler.cpu_threads import prefer_short_openmp_spin  # noqa: E402

_CHILD = r'''
import json, statistics, sys, time
import pooler
from pooler.bench import corpus
from pooler.engine.llm import Engine
engine = Engine()
queries = corpus.queries(int(sys.argv[1]), seed=7)
docs = corpus.mixed_corpus(int(sys.argv[2]))
for q in queries[:10]:
    engine.embed(q)
lat = []
for q in queries:
    s = time.perf_counter(); engine.embed(q); lat.append((time.perf_counter() - s) * 1e3)
engine.embed(docs[:16], use_tqdm=False)
s = time.perf_counter(); engine.embed(docs, use_tqdm=False)
print(json.dumps({"p50": statistics.median(lat), "tps": len(docs) / (time.perf_counter() - s),
                  "code": pooler.__file__}))
'''


def run_once(code_root: Path, queries: int, docs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code_root))
    prefer_short_openmp_spin(env)  # both copies alike, whatever an older one would set
    with tempfile.TemporaryDirectory() as cwd:  # not a folder holding another `pooler`
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(queries), str(docs)], env=env,
                              cwd=cwd, capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["code"].startswith(str(code_root)):
        raise RuntimeError(f"imported {out['code']}, not the copy under {code_root}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="folder holding one `pooler` package")
    parser.add_argument("b", type=Path, help="folder holding the other")
    parser.add_argument("--loads", default="0,2")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--docs", type=int, default=160)
    args = parser.parse_args()
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[tuple[int, str], list[dict]] = {}
    for load in (int(x) for x in args.loads.split(",")):
        with background_load(load):
            for rep in range(args.repeat):
                for name, root in sides.items():
                    out = run_once(root, args.queries, args.docs)
                    results.setdefault((load, name), []).append(out)
                    print(f"load {load} {name} ({root}) run {rep + 1}: p50 {out['p50']:.2f} ms, "
                          f"corpus {out['tps']:.1f} texts/s, loadavg {os.getloadavg()[0]:.1f}",
                          flush=True)
    print("medians:")
    for (load, name), outs in results.items():
        print(f"load {load} {name}: p50 {statistics.median(o['p50'] for o in outs):.2f} ms, "
              f"corpus {statistics.median(o['tps'] for o in outs):.1f} texts/s")


if __name__ == "__main__":
    main()
