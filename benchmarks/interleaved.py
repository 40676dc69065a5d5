"""What the in-process A/B scripts share (attention_bf16_ab.py, attention_kernel_lengths.py,
int8_kernel_ab.py, layer_stack_ab.py): their round and corpus options, timed rounds in alternating order (forward
in even rounds, reversed in odd ones), so a shared machine's drift reaches every side alike, and
a kernel as an older git revision has it, compiled beside the working tree's build."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Hashable

import numpy as np


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", choices=["long", "mixed"], default="long",
                        help="the long mix (300 short + 300 long texts) or the first 800 texts "
                             "of the bench's default corpus")
    parser.add_argument("--texts", type=int, default=0, help="first N of the corpus (0: all)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time in CPU seconds of this process instead of wall seconds")


_KERNELS = Path(__file__).resolve().parents[1] / "pooler" / "kernels"


def kernel_sources_at(rev: str, source: str) -> Path:
    """A new folder holding pooler/kernels/<source> and every header beside it (the headers
    build.py hashes with a source) as git revision `rev` has them (an old build to compile
    beside the working tree's)."""
    folder = Path(tempfile.mkdtemp(prefix="kernel-ab-"))
    listing = subprocess.run(["git", "ls-tree", "--name-only", rev, "."], check=True,
                             capture_output=True, text=True, cwd=_KERNELS).stdout.split()
    for name in [source] + [n for n in listing if n.endswith(".h")]:
        text = subprocess.run(["git", "show", f"{rev}:pooler/kernels/{name}"], check=True,
                              capture_output=True, text=True, cwd=_KERNELS).stdout
        (folder / name).write_text(text)
    return folder


def library_at(rev: str, source: str, cflags: list[str], like, functions: tuple[str, ...]):
    """`source` (with its headers) as git revision `rev` has it, compiled with `cflags` beside
    the working tree's build `like`, its `functions` typed as `like` types them. Returns (the
    library, the folder holding the sources)."""
    from pooler.kernels.build import load_library

    folder = kernel_sources_at(rev, source)
    lib, why = load_library(cflags, folder / source)
    if lib is None:
        raise SystemExit(f"the {rev} build failed: {why}")
    for name in functions:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = getattr(like, name).argtypes, getattr(like, name).restype
    return lib, folder


_ATTENTION_SOURCES = {"bf16": "attention_bf16.c", "fp32": "encoder_cpu.c"}
_ATTENTION_ENTRY_POINTS = {"bf16": ("attention_bf16_scratch_bytes", "packed_attention_bf16"),
                           "fp32": ("attention_scratch_floats", "packed_attention_f32")}


def attention_builds(kernel: str, rev: str) -> dict:
    """An attention kernel ("bf16": attention_bf16.c; "fp32": encoder_cpu.c's, attention.h) as
    {"new": the working tree's build, rev: the revision's}, compiled with the same flags and
    typed alike."""
    from pooler.kernels import attention_cpu, build

    if kernel == "bf16":
        new, cflags = attention_cpu._bf16_build(), attention_cpu._BF16_CFLAGS
    else:
        new = build.encoder_kernels()
        variant = build._variant(build.kernels_choice())
        cflags = None if variant is None else variant[1]
    if new is None:
        raise SystemExit(f"the {kernel} attention kernel does not run here")
    old = library_at(rev, _ATTENTION_SOURCES[kernel], cflags, new,
                     _ATTENTION_ENTRY_POINTS[kernel])[0]
    if kernel == "fp32":
        old.vector_floats = new.vector_floats
    return {"new": new, rev: old}


def corpus_texts(args: argparse.Namespace) -> list[str]:
    """--corpus's texts, the first --texts of them."""
    from pooler.bench import corpus

    texts = corpus.long_mix() if args.corpus == "long" else corpus.mixed_corpus()[:800]
    return texts[:args.texts] if args.texts else texts


def clock_label(args: argparse.Namespace) -> str:
    return f"{args.threads} threads, {'CPU' if args.cpu_time else 'wall'} time"


def run_rounds(sides: list[Hashable], embed: Callable[[Hashable], list], texts: list[str],
               args: argparse.Namespace, label: Callable[[Hashable], str] = str
               ) -> tuple[dict, dict]:
    """`embed(side)` runs one side over `texts` (returns the engine's outputs); prints each
    round. Returns (texts/s per side per round, each side's last embeddings [texts, dim])."""
    clock = time.process_time if args.cpu_time else time.perf_counter
    rates: dict = {side: [] for side in sides}
    outputs: dict = {}
    for index in range(args.rounds):
        for side in (sides if index % 2 == 0 else list(reversed(sides))):
            start = clock()
            out = embed(side)
            rates[side].append(len(texts) / (clock() - start))
            outputs[side] = np.stack([o.embedding for o in out]).astype(np.float64)
        print(f"round {index + 1}: " + ", ".join(f"{label(s)} {rates[s][-1]:.1f}" for s in sides)
              + f" texts/s; load average {os.getloadavg()[0]:.1f}", flush=True)
    return rates, outputs


def median_ratio(rates: dict, a: Hashable, b: Hashable) -> float:
    """Median over rounds of side a's texts/s over side b's (same round)."""
    return statistics.median(x / y for x, y in zip(rates[a], rates[b]))
