"""LoRA cost, interleaved in one process: the same texts through one engine as the base alone,
with 8 adapters mixed (round robin, one batch), and with one adapter for all of them.

    python benchmarks/lora_ab.py [--texts 256] [--corpus queries|mixed] [--reps 7]

`pooler bench --workload lora` runs each side in its own process, one after another; on a
shared machine the load moves between them. Here the three kinds alternate within each
repetition in one process (one engine, so the weights and kernels are the same), and the
ratio of the best times is printed: the adapters' cost with the drift hitting every kind
alike. Adapters: the bench's (pooler/bench/workloads/lora.py: rank 16 on query/key/value and
every dense layer of all-MiniLM-L6-v2), built once and cached under POOLER_BENCH_CACHE.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--corpus", choices=["queries", "mixed"], default="queries")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()

    from pooler.bench import corpus
    from pooler.bench.common import minilm_path
    from pooler.bench.workloads.lora import NUM_ADAPTERS, _adapter
    from pooler.cpu_features import cpu_features
    from pooler.engine.llm import Engine
    from pooler.params import PoolingParams

    texts = (corpus.queries(args.texts, seed=31) if args.corpus == "queries"
             else corpus.mixed_corpus(args.texts, seed=31))
    names = {f"a{i}": str(_adapter(i)) for i in range(NUM_ADAPTERS)}
    engine = Engine(str(minilm_path()), lora_modules=names, max_loras=NUM_ADAPTERS)
    processed = engine.processor.process(texts)
    kinds = {"base": [None] * len(texts),
             "8 mixed": [f"a{i % NUM_ADAPTERS}" for i in range(len(texts))],
             "1 adapter": ["a0"] * len(texts)}

    def run(loras):
        params = {n: engine.verify_params(PoolingParams(task="embed", lora=n))
                  for n in set(loras)}
        engine.run_processed(processed, [params[n] for n in loras], use_tqdm=False)

    for loras in kinds.values():  # warm up
        run(loras)
    seconds = {k: [] for k in kinds}
    for _ in range(args.reps):
        for kind, loras in kinds.items():
            start = time.perf_counter()
            run(loras)
            seconds[kind].append(time.perf_counter() - start)
    tokens = sum(len(p.prompt_token_ids) for p in processed)
    cpu = cpu_features()
    print(f"CPU: {cpu.model} ({cpu.kind()}: {' '.join(cpu.named())}); {os.cpu_count()} cores; "
          f"torch threads "
          f"{engine.config.num_threads}; load average {os.getloadavg()[0]:.1f}")
    print(f"{len(texts)} {args.corpus} texts, {tokens} tokens, {args.reps} reps interleaved")
    best_base = min(seconds["base"])
    for kind, values in seconds.items():
        print(f"{kind:10s} best {min(values):.3f} s  median {np.median(values):.3f} s  "
              f"throughput vs base (best) {best_base / min(values):.2f}x  "
              f"(median) {np.median(seconds['base']) / np.median(values):.2f}x")


if __name__ == "__main__":
    main()
