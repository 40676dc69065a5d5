"""Embedding workloads: a mixed corpus for throughput, short queries one at a time for latency.

Peers: sentence-transformers `encode` (at batch 32, and at the batch size that runs fastest here;
the baseline), and what a CPU user picks instead: ONNX Runtime on the model exported to ONNX (fp32
and its dynamic int8) and fastembed on that same export (pooler/bench/onnx_peer.py; skipped with
a line saying what to install when the `bench-peers` extra is absent).
"""
from __future__ import annotations

import time

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import (AVX2_ENV, flops_per_token, one_at_a_time, pooler_engine,
                                 pooler_sides, save_array, token_lens, with_env)
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

# Batch sizes the "best batch" peer side tries on a sample before its timed run.
_ST_BATCH_SIZES = (8, 16, 32, 64, 128)
_SWEEP_SAMPLE = 300


def corpus_texts(opts: BenchOptions) -> list[str]:
    """--corpus mixed (default): --corpus-size texts (2,000), half queries, half passages;
    long: issue 30's mix (300 texts of 5-15 words, 300 of 50-250 words); passages: 600 passages
    of 100-250 words."""
    kind = opts.extra.get("corpus") or "mixed"
    if kind == "passages":
        return corpus.long_corpus(48 if opts.quick else int(opts.extra.get("corpus_size") or 600))
    if kind == "long":
        return corpus.long_mix(*((24, 24) if opts.quick else (300, 300)))
    size = 48 if opts.quick else int(opts.extra.get("corpus_size") or 2000)
    return corpus.mixed_corpus(size)


def query_texts(opts: BenchOptions) -> list[str]:
    return corpus.queries(12 if opts.quick else 200, seed=7)


def _token_lens(opts: BenchOptions, texts: list[str]) -> list[int]:
    return token_lens(opts.model, texts)


def _flops_per_token(opts: BenchOptions) -> float:
    from pooler.model_folder import resolve_model_path

    return flops_per_token(resolve_model_path(opts.model), _token_lens(opts, corpus_texts(opts)))


# ---- pooler -------------------------------------------------------------------------------
def _engine(opts: BenchOptions, quantization: str | None):
    return pooler_engine(opts.model, opts, quantization)


def _pooler_throughput(quantization: str | None, side: str):
    def run(opts: BenchOptions) -> SideResult:
        texts = corpus_texts(opts)
        tokens = sum(_token_lens(opts, texts))
        engine = _engine(opts, quantization)
        engine.embed(texts[:32], use_tqdm=False)  # warm up kernels and allocator
        loaded = rss_mb()
        start = time.perf_counter()
        outputs = engine.embed(texts, use_tqdm=False)
        seconds = time.perf_counter() - start
        emb = np.stack([o.embedding for o in outputs])
        return SideResult(side, "pooler", len(texts), tokens, seconds, loaded_rss_mb=loaded,
                          outputs_file=save_array(opts, f"embed-{side}", emb))
    return run


def interleaved_rounds(opts: BenchOptions) -> int:
    """--interleaved-rounds (default 3; 1 with --quick; 0: no interleaved side)."""
    rounds = opts.extra.get("interleaved_rounds")
    return (1 if opts.quick else 3) if rounds is None else int(rounds)


def _pooler_interleaved(quantization: str | None, dtype: str, side: str, fp32_label: str = ""):
    """The precision variant (int8, or bf16 on the CPU) and pooler fp32 in one process, timed
    over the corpus in alternating rounds (fp32 first in even rounds, the variant first in odd
    ones), so drift on a shared machine reaches both alike: each round gives a ratio, and the
    side's texts/s is the variant's median round. fp32_label names the fp32 engine's build in
    the note where it is not this CPU's best (the AVX2 side)."""
    from dataclasses import replace

    def run(opts: BenchOptions) -> SideResult:
        texts = corpus_texts(opts)
        tokens = sum(_token_lens(opts, texts))
        engines = {"fp32": _engine(replace(opts, dtype="float32"), None),
                   "variant": _engine(replace(opts, dtype=dtype), quantization)}
        for engine in engines.values():
            engine.embed(texts[:32], use_tqdm=False)  # warm up kernels and allocator
        loaded = rss_mb()
        seconds: dict[str, list[float]] = {"fp32": [], "variant": []}
        outputs = None
        for index in range(interleaved_rounds(opts)):  # >= 1: _interleaved_sides
            for name in (("fp32", "variant") if index % 2 == 0 else ("variant", "fp32")):
                start = time.perf_counter()
                out = engines[name].embed(texts, use_tqdm=False)
                seconds[name].append(time.perf_counter() - start)
                if name == "variant":
                    outputs = out
        ratios = [f / v for f, v in zip(seconds["fp32"], seconds["variant"])]
        emb = np.stack([o.embedding for o in outputs])
        fp32_rate = len(texts) / float(np.median(seconds["fp32"]))
        return SideResult(side, "pooler", len(texts), tokens, float(np.median(seconds["variant"])),
                          loaded_rss_mb=loaded, interleaved_vs_fp32=ratios,
                          note=f"{len(ratios)} round{'s' * (len(ratios) != 1)} alternating "
                               f"with pooler fp32{fp32_label} in one process (fp32 "
                               f"{fp32_rate:.1f} texts/s there)",
                          outputs_file=save_array(opts, f"embed-{side.replace(' ', '-')}", emb))
    return run


def _interleaved_sides(opts: BenchOptions) -> list[Side]:
    """With --quantization int8, or --dtype bfloat16 on the CPU: the variant timed against
    pooler fp32 in one process (see _pooler_interleaved)."""
    if not interleaved_rounds(opts):
        return []
    sides = []
    if opts.dtype == "bfloat16" and opts.device == "cpu":
        sides.append(Side("pooler bf16 interleaved", "pooler",
                          _pooler_interleaved(None, "bfloat16", "pooler bf16 interleaved")))
    if opts.quantization == "int8":
        sides.append(Side("pooler int8 interleaved", "pooler",
                          _pooler_interleaved("int8", "float32", "pooler int8 interleaved")))
        from pooler.kernels.int8_cpu import runnable_paths

        if runnable_paths()[:1] == ["avx512-vnni"] and "avx2" in runnable_paths():
            # What an AVX2-only CPU runs, int8 against fp32 both on AVX2 builds (issue 30's
            # AVX2 target is int8 over fp32 there): pooler's C kernels and oneDNN held to AVX2.
            name = "pooler int8 avx2 interleaved"
            sides.append(Side(name, "pooler", with_env(
                _pooler_interleaved("int8", "float32", name, " (AVX2 build too)"),
                AVX2_ENV)))
    return sides


def _pooler_latency(quantization: str | None, side: str):
    def run(opts: BenchOptions) -> SideResult:
        texts = query_texts(opts)
        engine = _engine(opts, quantization)
        for text in texts[:10]:
            engine.embed(text)
        loaded = rss_mb()
        start = time.perf_counter()
        latencies, outputs = one_at_a_time(lambda t: engine.embed(t)[0].embedding, texts)
        seconds = time.perf_counter() - start
        return SideResult(side, "pooler", len(texts), sum(_token_lens(opts, texts)), seconds,
                          latencies, loaded_rss_mb=loaded,
                          outputs_file=save_array(opts, f"single_query-{side}", np.stack(outputs)))
    return run


def _pooler_latency_interleaved(quantization: str | None, dtype: str, side: str):
    """The precision variant (int8, or bf16 on the CPU) and pooler fp32 in one process, each
    embedding the queries one call at a time, in alternating rounds (fp32 first in even
    rounds): drift on a shared machine reaches both alike. A round is a whole pass over the
    queries on one engine, so each engine runs with its own weights warm in the caches, as a
    server of one model does. Each round gives fp32 p50 / variant p50 (above 1: the variant
    answers faster); the side's latencies are the variant's, over every round."""
    from dataclasses import replace

    from pooler.bench.common import engine_step_paths

    def run(opts: BenchOptions) -> SideResult:
        texts = query_texts(opts)
        engines = {"fp32": _engine(replace(opts, dtype="float32"), None),
                   "variant": _engine(replace(opts, dtype=dtype), quantization)}
        for engine in engines.values():
            for text in texts[:10]:
                engine.embed(text)
        loaded = rss_mb()
        latencies: dict[str, list[list[float]]] = {"fp32": [], "variant": []}
        seconds, outputs = 0.0, None
        for index in range(max(1, interleaved_rounds(opts))):
            for name in (("fp32", "variant") if index % 2 == 0 else ("variant", "fp32")):
                engine = engines[name]
                start = time.perf_counter()
                times, out = one_at_a_time(lambda t: engine.embed(t)[0].embedding, texts)
                if name == "variant":
                    seconds += time.perf_counter() - start
                    outputs = out
                latencies[name].append(times)
        ratios = [float(np.percentile(f, 50) / np.percentile(v, 50))
                  for f, v in zip(latencies["fp32"], latencies["variant"])]
        fp32_all = [x for times in latencies["fp32"] for x in times]
        fp32_p50, fp32_p99 = np.percentile(fp32_all, [50, 99])
        rounds = len(ratios)
        return SideResult(side, "pooler", len(texts) * rounds,
                          sum(_token_lens(opts, texts)) * rounds, seconds,
                          [x for times in latencies["variant"] for x in times],
                          loaded_rss_mb=loaded, interleaved_vs_fp32=ratios,
                          step_paths=engine_step_paths(engines["variant"]),
                          note=f"{rounds} round{'s' * (rounds != 1)} alternating with pooler "
                               f"fp32 in one process (fp32 p50 {fp32_p50:.2f}, p99 "
                               f"{fp32_p99:.2f} ms there)",
                          outputs_file=save_array(opts, f"single_query-{_slug(side)}",
                                                  np.stack(outputs)))
    return run


def _latency_interleaved_sides(opts: BenchOptions) -> list[Side]:
    """With --quantization int8, or --dtype bfloat16 on the CPU: the variant's single queries
    timed against pooler fp32's in one process (see _pooler_latency_interleaved)."""
    if not interleaved_rounds(opts):
        return []
    sides = []
    if opts.dtype == "bfloat16" and opts.device == "cpu":
        sides.append(Side("pooler bf16 interleaved", "pooler", _pooler_latency_interleaved(
            None, "bfloat16", "pooler bf16 interleaved")))
    if opts.quantization == "int8":
        sides.append(Side("pooler int8 interleaved", "pooler", _pooler_latency_interleaved(
            "int8", "float32", "pooler int8 interleaved")))
    return sides


# ---- sentence-transformers ----------------------------------------------------------------
def _sentence_transformer(opts: BenchOptions):
    from sentence_transformers import SentenceTransformer

    from pooler.model_folder import resolve_model_path

    device = "cuda" if opts.device == "cuda" else "cpu"
    # On a GPU the peer runs in the dtype pooler runs in (e.g. bf16), or the ratio compares
    # precisions instead of engines. On the CPU it runs fp32, as CPU users run it: pooler's
    # bf16 side is its own row beside pooler fp32 (common.pooler_sides).
    fp32 = opts.dtype == "float32" or device == "cpu"
    kwargs = {} if fp32 else {"model_kwargs": {"dtype": opts.dtype}}
    return SentenceTransformer(str(resolve_model_path(opts.model)), device=device, **kwargs)


def _st_encode_rate(model, texts: list[str], batch_size: int) -> float:
    start = time.perf_counter()
    model.encode(texts, batch_size=batch_size)
    return len(texts) / (time.perf_counter() - start)


def _st_throughput(batch_size: int | None, side: str):
    """batch_size None: sweep _ST_BATCH_SIZES on a sample, then time the fastest."""
    def run(opts: BenchOptions) -> SideResult:
        texts = corpus_texts(opts)
        tokens = sum(_token_lens(opts, texts))
        model = _sentence_transformer(opts)
        model.encode(texts[:32], batch_size=32)  # warm up
        note = ""
        chosen = batch_size
        if chosen is None:
            candidates = (32,) if opts.quick else _ST_BATCH_SIZES
            sample = texts[:_SWEEP_SAMPLE]
            rates = {b: _st_encode_rate(model, sample, b) for b in candidates}
            chosen = max(rates, key=rates.get)
            note = "sweep texts/s " + ", ".join(f"b{b}={r:.0f}" for b, r in rates.items())
        loaded = rss_mb()
        start = time.perf_counter()
        emb = model.encode(texts, batch_size=chosen, convert_to_numpy=True)
        seconds = time.perf_counter() - start
        note = f"batch {chosen}" + (f"; {note}" if note else "")
        return SideResult(side, "peer", len(texts), tokens, seconds, loaded_rss_mb=loaded,
                          note=note, outputs_file=save_array(opts, f"embed-{side}", emb))
    return run


def _st_latency(opts: BenchOptions) -> SideResult:
    texts = query_texts(opts)
    model = _sentence_transformer(opts)
    for text in texts[:10]:
        model.encode(text)
    loaded = rss_mb()
    start = time.perf_counter()
    latencies, outputs = one_at_a_time(model.encode, texts)
    seconds = time.perf_counter() - start
    return SideResult("sentence-transformers", "peer", len(texts),
                      sum(_token_lens(opts, texts)), seconds, latencies, loaded_rss_mb=loaded,
                      outputs_file=save_array(opts, "single_query-st", np.stack(outputs)))


# ---- ONNX Runtime and fastembed (pooler/bench/onnx_peer.py) --------------------------------
_ORT_PACKAGES = ("onnxruntime", "onnx", "onnxscript")  # run, quantize, export
_ORT_BATCH = 32  # sentence-transformers' default batch, on length-sorted texts like it


def _onnx_skip(opts: BenchOptions, *packages: str) -> str | None:
    from pooler.bench import onnx_peer
    from pooler.model_folder import resolve_model_path

    if opts.device != "cpu":
        return "the ONNX Runtime peers run on CPU only"
    reason = onnx_peer.skip_reason(*packages)
    if reason:
        return reason
    try:
        onnx_peer.recipe(resolve_model_path(opts.model))
    except ValueError as exc:
        return str(exc)
    return None


def _onnx_encoder(opts: BenchOptions, kind: str, onnx_file: str):
    """A callable texts -> [n, hidden] float32 for the side `kind` ("ort" or "fastembed")."""
    from pooler.bench import onnx_peer
    from pooler.model_folder import resolve_model_path

    path = resolve_model_path(opts.model)
    if kind == "ort":
        model = onnx_peer.OrtEmbedder(path, onnx_file, opts.threads)
        return lambda texts: model.encode(texts, batch_size=_ORT_BATCH)
    model = onnx_peer.fastembed_model(path, onnx_file, opts.threads)
    return lambda texts: np.stack(list(model.embed(texts)))  # its default batch size (256)


def _onnx_throughput(kind: str, onnx_file: str, side: str):
    def run(opts: BenchOptions) -> SideResult:
        texts = corpus_texts(opts)
        tokens = sum(_token_lens(opts, texts))
        encode = _onnx_encoder(opts, kind, onnx_file)
        encode(texts[:32])  # warm up
        loaded = rss_mb()
        start = time.perf_counter()
        emb = encode(texts)
        seconds = time.perf_counter() - start
        note = f"batch {_ORT_BATCH}, length-sorted" if kind == "ort" else "fastembed defaults"
        return SideResult(side, "peer", len(texts), tokens, seconds, loaded_rss_mb=loaded,
                          note=note, outputs_file=save_array(opts, f"embed-{_slug(side)}", emb))
    return run


def _onnx_latency(kind: str, onnx_file: str, side: str):
    def run(opts: BenchOptions) -> SideResult:
        texts = query_texts(opts)
        encode = _onnx_encoder(opts, kind, onnx_file)
        for text in texts[:10]:
            encode([text])
        loaded = rss_mb()
        start = time.perf_counter()
        latencies, outputs = one_at_a_time(lambda t: encode([t])[0], texts)
        seconds = time.perf_counter() - start
        return SideResult(side, "peer", len(texts), sum(_token_lens(opts, texts)), seconds,
                          latencies, loaded_rss_mb=loaded,
                          outputs_file=save_array(opts, f"single_query-{_slug(side)}",
                                                  np.stack(outputs)))
    return run


def _slug(side: str) -> str:
    return side.replace(" ", "-")


def _onnx_sides(opts: BenchOptions, make) -> list[Side]:
    from pooler.bench.onnx_peer import FP32_FILE, INT8_FILE

    ort_skip = _onnx_skip(opts, *_ORT_PACKAGES)
    fastembed_skip = _onnx_skip(opts, *_ORT_PACKAGES, "fastembed")
    return [Side("ort fp32", "peer", make("ort", FP32_FILE, "ort fp32"), skip=ort_skip),
            Side("ort int8", "peer", make("ort", INT8_FILE, "ort int8"), skip=ort_skip),
            Side("fastembed", "peer", make("fastembed", FP32_FILE, "fastembed"),
                 skip=fastembed_skip)]


# ---- registration -------------------------------------------------------------------------
def _embed_sides(opts: BenchOptions) -> list[Side]:
    return pooler_sides(opts, _pooler_throughput) + _interleaved_sides(opts) + [
        Side("st b32", "peer", _st_throughput(32, "st b32")),
        Side("st best", "peer", _st_throughput(None, "st best")),
    ] + _onnx_sides(opts, _onnx_throughput)


def _latency_sides(opts: BenchOptions) -> list[Side]:
    return pooler_sides(opts, _pooler_latency) + _latency_interleaved_sides(opts) + [
        Side("sentence-transformers", "peer", _st_latency),
    ] + _onnx_sides(opts, _onnx_latency)


register(Workload(
    name="embed",
    description="embed a mixed corpus (half 5-15-word queries, half 50-250-word passages) "
                "vs sentence-transformers encode, ONNX Runtime (fp32, int8) and fastembed",
    metric="throughput", sides=_embed_sides, baseline="st b32",
    flops_per_token=_flops_per_token))

register(Workload(
    name="single_query",
    description="embed short queries one call at a time vs sentence-transformers encode, "
                "ONNX Runtime (fp32, int8) and fastembed: p50, p90, p99, and the path each "
                "step size takes in pooler",
    metric="latency", sides=_latency_sides, baseline="sentence-transformers"))
