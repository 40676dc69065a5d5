"""Corpus throughput under N busy processes (their own sessions): pooler with the contention rule
off (every thread) and on (the default: corpus steps take half the threads while contended),
and sentence-transformers (batch 32), under the OpenMP settings compared in docs/dev/journal.md.

    python benchmarks/corpus_threads_ab.py [--load 2] [--rounds 2] [--texts 300]

One fresh process per side per round (OpenMP reads its settings when torch loads), sides
interleaved; each embeds the bench's mixed corpus (pooler/bench/corpus.py) after a 32-text
warm-up. Prints texts/s per round and the median per side.
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
import sys, time
side, n = sys.argv[1], int(sys.argv[2])
from pooler.bench import corpus
from pooler.model_folder import DEFAULT_MODEL, resolve_model_path
texts = corpus.mixed_corpus(n)
if side == "pooler":
    from pooler import Engine
    engine = Engine(DEFAULT_MODEL)
    run = lambda batch: engine.embed(batch, use_tqdm=False)
else:
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(resolve_model_path(DEFAULT_MODEL)), device="cpu")
    run = lambda batch: model.encode(batch, batch_size=32)
run(texts[:32])
start = time.perf_counter()
run(texts)
print(len(texts) / (time.perf_counter() - start))
'''

_RULE = "POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS"
SIDES = {  # name -> (side, environment)
    "pooler, spin 10000, rule off": ("pooler", {"GOMP_SPINCOUNT": "10000", _RULE: "0"}),
    "pooler, spin 10000, rule (default)": ("pooler", {"GOMP_SPINCOUNT": "10000"}),
    "st b32, spin 10000": ("st", {"GOMP_SPINCOUNT": "10000"}),
    "pooler, PASSIVE, rule off": ("pooler", {"OMP_WAIT_POLICY": "PASSIVE", _RULE: "0"}),
    "st b32, PASSIVE": ("st", {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=int, default=300)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in SIDES}
    with background_load(args.load):
        for round_ in range(args.rounds):
            for name, (side, extra) in SIDES.items():
                env = {k: v for k, v in os.environ.items()
                       if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", _RULE)}
                env.update(extra, HF_HUB_OFFLINE="1")
                out = subprocess.run([sys.executable, "-c", _CHILD, side, str(args.texts)],
                                     env=env, capture_output=True, text=True, check=True,
                                     cwd=Path(__file__).resolve().parents[1]).stdout
                rates[name].append(float(out.split()[-1]))
                print(f"load {args.load} round {round_ + 1} {name}: {rates[name][-1]:.1f} texts/s "
                      f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    for name, values in rates.items():
        print(f"{name:48s} median {statistics.median(values):.1f} texts/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
