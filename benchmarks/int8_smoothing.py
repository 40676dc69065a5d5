"""int8 accuracy and speed with and without per-input-channel smoothing (issue 30, part 1).

Accuracy: min / mean cosine of each int8 engine's embeddings to the fp32 engine's on the bench
corpus (`pooler.bench.corpus.mixed_corpus`, 2,000 texts), for the VNNI build and the AVX2 build
(POOLER_CPU_KERNELS=avx2, where the CPU runs both), smoothed (today's load) and unsmoothed (no
calibration forward: QKV in fp32, as before; best build only). Speed: texts/s of fp32 and int8 engines in one
process, interleaved rounds over the mixed and the long corpora (`long_mix`), printed as ratios.

  PYTHONPATH=$PWD .venv/bin/python benchmarks/int8_smoothing.py [--texts 2000] [--rounds 3]
      [--skip-accuracy] [--cpu-time]  # CPU seconds at 1 thread: for a shared, loaded machine
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import contextmanager

import numpy as np

from pooler import Engine
from pooler.bench.corpus import long_mix, mixed_corpus
from pooler.cpu_features import cpu_features
from pooler.kernels.int8_cpu import runnable_paths
from pooler.worker import model_runner

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@contextmanager
def int8_variant(path: str, smoothed: bool):
    """Engines built inside take this int8 build, with or without the calibration forward."""
    saved_env, saved_cal = os.environ.get("POOLER_CPU_KERNELS"), model_runner.calibration_forward
    if path == "avx2":
        os.environ["POOLER_CPU_KERNELS"] = "avx2"
    if not smoothed:
        model_runner.calibration_forward = lambda config: None
    try:
        yield
    finally:
        model_runner.calibration_forward = saved_cal
        if saved_env is None:
            os.environ.pop("POOLER_CPU_KERNELS", None)
        else:
            os.environ["POOLER_CPU_KERNELS"] = saved_env


def embed(engine: Engine, texts: list[str]) -> np.ndarray:
    return np.stack([o.embedding for o in engine.embed(texts, use_tqdm=False)])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-texts", type=int, default=600)
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time CPU seconds of this process at --threads (default 1) "
                        "instead of wall clock: far less disturbed by other processes")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    print(f"CPU: {cpu_features().summary()}")
    threads = args.threads or (1 if args.cpu_time else None)
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(f"clock: {'process CPU time' if args.cpu_time else 'wall'}, threads {threads or 'default'}")
    fp32 = Engine(MODEL, device="cpu", num_threads=threads)
    engines = {}
    for path in runnable_paths():
        # unsmoothed (QKV fp32, the scheme before smoothing) on the best build only
        for smoothed in (True, False) if path == runnable_paths()[0] else (True,):
            with int8_variant(path, smoothed):
                engines[(path, smoothed)] = Engine(MODEL, device="cpu", quantization="int8",
                                                   precision_check="off", num_threads=threads)
    if not args.skip_accuracy:
        texts = mixed_corpus(args.texts)
        ref = embed(fp32, texts)
        for (path, smoothed), engine in engines.items():
            c = cosines(ref, embed(engine, texts))
            print(f"accuracy {path:12s} {'smoothed' if smoothed else 'unsmoothed':10s} "
                  f"min {c.min():.5f} mean {c.mean():.6f} (n={len(texts)})", flush=True)
    if args.rounds == 0:  # accuracy only
        return
    corpora = {"mixed": mixed_corpus(args.speed_texts),
               "long": long_mix(args.speed_texts // 2, args.speed_texts // 2)}
    for name, texts in corpora.items():
        rates: dict[str, list[float]] = {"fp32": []}
        for key in engines:
            rates[f"{key[0]} {'smoothed' if key[1] else 'unsmoothed'}"] = []
        for _ in range(args.rounds):  # interleaved: each round times every engine once
            for label, engine in [("fp32", fp32)] + [
                    (f"{k[0]} {'smoothed' if k[1] else 'unsmoothed'}", e)
                    for k, e in engines.items()]:
                start = clock()
                embed(engine, texts)
                rates[label].append(len(texts) / (clock() - start))
        base = statistics.median(rates["fp32"])
        for label, r in rates.items():
            print(f"speed {name:5s} {label:25s} {statistics.median(r):7.1f} texts/s "
                  f"= {statistics.median(r) / base:.2f}x fp32 (rounds: "
                  f"{', '.join(f'{v:.0f}' for v in r)})", flush=True)


if __name__ == "__main__":
    main()
