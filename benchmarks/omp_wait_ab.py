"""One short query p50 under OpenMP wait settings (PASSIVE, libgomp default, GOMP_SPINCOUNT), quiet
and with 2 busy processes in their own sessions. Usage: python benchmarks/omp_wait_ab.py"""
import os, subprocess, sys, time, statistics
CHILD = r'''
import time, statistics
from pooler import Engine
from pooler.bench.corpus import queries
e = Engine("sentence-transformers/all-MiniLM-L6-v2")
qs = queries(150, seed=7)
for q in qs[:20]: e.embed(q, use_tqdm=False)
ts = []
for q in qs[20:150]:
    t = time.perf_counter(); e.embed(q, use_tqdm=False); ts.append((time.perf_counter() - t) * 1e3)
print(round(statistics.median(ts), 2))
'''
SETTINGS = {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "default(active spin)": {},
            "GOMP_SPINCOUNT=10000": {"GOMP_SPINCOUNT": "10000"},
            "GOMP_SPINCOUNT=100000": {"GOMP_SPINCOUNT": "100000"}}
def run(extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]
for load in (0, 2):
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(load)]
    try:
        for rnd in range(2):
            for name, extra in SETTINGS.items():
                print(f"load {load} round {rnd} {name}: p50 {run(extra)} ms", flush=True)
    finally:
        for s in spinners: s.kill()
