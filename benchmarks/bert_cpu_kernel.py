"""One sequence at a time through Engine.embed: the C layer stack (pooler/kernels/encoder_cpu.c)
against the torch layers (oneDNN GEMMs) by sequence length, interleaved in one process, on the
default model (all-MiniLM-L6-v2). This is how bert_cpu.MAX_TOKENS was chosen.

    python benchmarks/bert_cpu_kernel.py [--threads 2] [--rounds 3] [--lengths 12,24,48,64,96]
    POOLER_CPU_KERNELS=avx2 python benchmarks/bert_cpu_kernel.py ...   # the AVX2 build

Each cell is the best of `--rounds` medians of 25 calls (tokenization included), after 5 warm-up
calls per side per round.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", default="12,24,32,48,64,96,128")
    args = parser.parse_args()
    from pooler.cpu_threads import prefer_short_openmp_spin

    prefer_short_openmp_spin(os.environ)
    import pooler.kernels.bert_cpu as bert_cpu
    import pooler.models.bert as bert
    from pooler.bench.common import median_call_seconds
    from pooler.engine.llm import Engine
    from pooler.kernels.build import encoder_kernels
    from pooler.model_folder import DEFAULT_MODEL

    if encoder_kernels() is None:
        print("the CPU kernels are unavailable here (see pooler/kernels/build.py)")
        return 1
    bert_cpu.MAX_TOKENS = 1 << 30  # let every length through; the sides differ only in this
    engine = Engine(DEFAULT_MODEL, num_threads=args.threads)
    sides = {"C kernel": bert_cpu.bert_layers_on_cpu, "torch": lambda *a: None}

    print(f"threads {args.threads}, kernel build {encoder_kernels().variant} "
          f"(POOLER_CPU_KERNELS=avx2 picks the AVX2 one), load average {os.getloadavg()[0]:.2f}")
    print("tokens | C kernel ms | torch ms | torch / C")
    for length in (int(v) for v in args.lengths.split(",")):
        text = " ".join(["hello"] * (length - 2))  # + [CLS] and [SEP]
        best = {name: float("inf") for name in sides}
        for _ in range(args.rounds):
            for name, fn in sides.items():
                bert.bert_layers_on_cpu = fn
                best[name] = min(best[name], 1e3 * median_call_seconds(
                    lambda: engine.embed(text), 25, warmup=5))
        print(f"{length:6d} | {best['C kernel']:11.2f} | {best['torch']:8.2f} | "
              f"{best['torch'] / best['C kernel']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
