"""Visual retrieval: index page images with ColModernVBert (pages indexed/s) and answer short
text queries against the index (query latency), at the real model shape with seeded weights
(pooler/bench/page_folders.py) on seeded page-like PNGs (pooler/bench/images.py).

Libraries: pooler (`Engine.encode_documents` on the encoded page bytes; per query
`Engine.encode_queries` + MaxSim over the indexed multi-vectors) and transformers
(`ColModernVBertProcessor.process_images` + `ColModernVBertForRetrieval`, one page per call:
a letter page is already 17 tiles for the vision tower; per query `process_queries` + the model
+ `score_retrieval`). Both run in ONE process, timed in alternating rounds (the order rotates
each round), so drift on a shared machine reaches both alike; each row is its median round and
the lines under the table give the ratios round by round.

Rows: "index" (pages/s; phases per page: decode = encoded bytes -> RGB image, pooler's also
hashes the pixels for its caches; preprocess = resize, tile split, rescale, normalize and the
prompt's token ids; model = the rest of the call) and "query" (one query at a time: p50/p99
latency of encode + MaxSim against every indexed page; phases encode and maxsim). pooler's
encode_documents does decode and preprocessing inside: they are timed by separate passes of the
same code over the same pages, and model is the call's time minus them. pooler's image caches
are cleared before every round.

% ceiling (index rows): the vision tower's FLOPs on the pages' tiles per second of the whole
call, as a share of the fp32 GEMM ceiling (the text tower over ~1,100 tokens a page is not
counted, so this understates the model's share).
"""
from __future__ import annotations

import io
import json
import statistics
import time

import numpy as np

from pooler.bench.common import pooler_engine, save_array
from pooler.bench.images import bench_pages, bench_queries
from pooler.bench.machine import rss_mb
from pooler.bench.page_folders import page_folder, vision_flops_per_tile
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register
from pooler.bench.workloads.image_embed import _decode_rgb, _Timer, rounds

MODEL = "colmodernvbert"
DEFAULT_PAGES = 6
DEFAULT_QUERIES = 16
LIBRARIES = ("pooler", "transformers")


def _inputs(opts: BenchOptions) -> tuple[list[bytes], list[str]]:
    pages = 2 if opts.quick else int(opts.extra.get("corpus_size") or DEFAULT_PAGES)
    return bench_pages(pages, seed=0, tiny=opts.quick), \
        bench_queries(4 if opts.quick else DEFAULT_QUERIES)


def _maxsim(query, pages) -> np.ndarray:
    """pooler's MaxSim (the runner's, over packed pages): [num_pages] scores."""
    import torch

    from pooler.worker.late_interaction import maxsim

    return torch.stack(maxsim(query, pages)).numpy()


# ---- the two libraries: index(pages) -> (per-page [tokens, dim], phases, seconds) and
# query(text, index) -> ([num_pages] scores, phases) -----------------------------------------
class _Pooler:
    role = "pooler"
    note = "encode_documents; encode_queries + MaxSim"

    def __init__(self, path, opts: BenchOptions):
        self.engine = pooler_engine(path, opts)

    def index(self, data: list[bytes]):
        import torch

        from pooler.multimodal.colmodernvbert_inputs import build_document_inputs
        from pooler.multimodal.media import load_image

        self.engine.reset_encoder_cache()  # every round computes every page
        self.engine.reset_mm_cache()
        start = time.perf_counter()
        out = self.engine.encode_documents(data, use_tqdm=False)
        total = time.perf_counter() - start
        # The same decode and preprocessing code again, timed apart (outside the call).
        pages = self.engine.pages
        timer = _Timer()
        decoded = timer.time("decode", lambda: [load_image(b, i) for i, b in enumerate(data)])
        docs = timer.time("preprocess", lambda: [build_document_inputs(
            d.image, pages.prompts, pages.tokenizer) for d in decoded])
        self.tiles = sum(d.num_tiles for d in docs)
        phases = {**timer.phases, "model": max(0.0, total - sum(timer.phases.values()))}
        return [torch.from_numpy(o.embeddings) for o in out], phases, total

    def query(self, text: str, index: list):
        timer = _Timer()
        [q] = timer.time("encode", lambda: self.engine.encode_queries([text], use_tqdm=False))
        import torch

        scores = timer.time("maxsim", lambda: _maxsim(torch.from_numpy(q.embeddings), index))
        return scores, timer.phases


class _Transformers:
    role = "peer"
    note = "process_images + forward, 1 page a call; process_queries + forward + score_retrieval"

    def __init__(self, path, opts: BenchOptions):
        import torch
        import transformers

        self.model = transformers.ColModernVBertForRetrieval.from_pretrained(
            str(path), dtype=torch.float32).eval()
        self.processor = transformers.ColModernVBertProcessor.from_pretrained(str(path))

    def _embed(self, inputs) -> list:
        import torch

        with torch.inference_mode():
            out = self.model(**inputs).embeddings            # [batch, seq, dim]
        mask = inputs["attention_mask"].bool()               # [batch, seq]
        return [e[m] for e, m in zip(out, mask)]             # [tokens_i, dim] each

    def index(self, data: list[bytes]):
        start = time.perf_counter()
        timer = _Timer()
        decoded = timer.time("decode", lambda: [_decode_rgb(b) for b in data])
        out = []
        for image in decoded:
            inputs = timer.time("preprocess", lambda: self.processor.process_images([image]))
            out.extend(timer.time("model", lambda: self._embed(inputs)))
        return out, timer.phases, time.perf_counter() - start

    def query(self, text: str, index: list):
        timer = _Timer()
        inputs = timer.time("encode", lambda: self.processor.process_queries([text]))
        [q] = timer.time("encode", lambda: self._embed(inputs))
        scores = timer.time("maxsim", lambda: self.processor.score_retrieval([q], index))
        return scores[0].numpy(), timer.phases


def _load(library: str, path, opts: BenchOptions):
    return _Pooler(path, opts) if library == "pooler" else _Transformers(path, opts)


def row_name(kind: str, library: str) -> str:
    return f"{MODEL} {kind} {library}"


def _median_phases(rounds_phases: list[dict]) -> dict[str, float]:
    return {p: statistics.median(r.get(p, 0.0) for r in rounds_phases)
            for p in rounds_phases[0]}


def _run(opts: BenchOptions) -> list[SideResult]:
    path = page_folder(tiny=opts.quick)
    hf_config = json.loads((path / "config.json").read_text())
    data, queries = _inputs(opts)
    warm_page = bench_pages(1, seed=9, tiny=True)  # a small page: warms kernels cheaply
    libs, failed, loaded = {}, {}, {}
    for library in LIBRARIES:
        before = rss_mb()
        try:
            lib = _load(library, path, opts)
            warm_index, _, _ = lib.index(warm_page)
            lib.query(queries[0], warm_index)
        except Exception as exc:  # noqa: BLE001 - reported in the table, others still run
            failed[library] = f"{type(exc).__name__}: {exc}"
            continue
        libs[library], loaded[library] = lib, rss_mb() - before
    index_s = {k: [] for k in libs}
    index_phases = {k: [] for k in libs}
    latencies = {k: [] for k in libs}           # ms, every query of every round
    query_s = {k: [] for k in libs}             # per round: seconds over its queries
    query_phases = {k: [] for k in libs}
    vectors, scores = {}, {}
    order = list(libs)
    for index in range(rounds(opts)):
        turn = order[index % len(order):] + order[:index % len(order)] if order else []
        for library in turn:  # index the pages, then answer every query, each library in turn
            lib = libs[library]
            vectors[library], phases, seconds = lib.index(data)
            index_s[library].append(seconds)
            index_phases[library].append(phases)
            round_phases, round_scores, start = {}, [], time.perf_counter()
            for text in queries:
                t0 = time.perf_counter()
                row, phases = lib.query(text, vectors[library])
                latencies[library].append(1e3 * (time.perf_counter() - t0))
                round_scores.append(row)
                for p, s in phases.items():
                    round_phases[p] = round_phases.get(p, 0.0) + s
            query_s[library].append(time.perf_counter() - start)
            query_phases[library].append(round_phases)
            scores[library] = np.stack(round_scores)   # [num_queries, num_pages]
    tiles = getattr(libs.get("pooler"), "tiles", 0)
    flops = vision_flops_per_tile(hf_config) * tiles
    results = []
    for library in LIBRARIES:
        role = "pooler" if library == "pooler" else "peer"
        if library in failed:
            results += [SideResult(row_name(kind, library), role, error=failed[library][:300])
                        for kind in ("index", "query")]
            continue
        lib = libs[library]
        phases = _median_phases(index_phases[library])
        tokens = sum(int(v.shape[0]) for v in vectors[library])
        split = ", ".join(f"{p} {1e3 * s / len(data):.0f}" for p, s in phases.items())
        note = f"ms/page: {split}; {tiles} tiles, {tokens} vectors; {lib.note}"
        results.append(SideResult(
            row_name("index", library), role, len(data), tokens,
            statistics.median(index_s[library]), loaded_rss_mb=loaded[library], note=note,
            phases_s=phases, model_flops=flops,
            rounds_per_s=[len(data) / s for s in index_s[library]],
            outputs_file=save_array(opts, f"visual_retrieval-index-{library}",
                                    np.concatenate([v.numpy() for v in vectors[library]]))))
        qphases = _median_phases(query_phases[library])
        split = ", ".join(f"{p} {1e3 * s / len(queries):.1f}" for p, s in qphases.items())
        results.append(SideResult(
            row_name("query", library), role, len(queries), 0,
            statistics.median(query_s[library]), latencies_ms=latencies[library],
            loaded_rss_mb=loaded[library], phases_s=qphases,
            note=f"ms/query: {split}; {len(queries)} queries x {len(data)} pages",
            rounds_per_s=[len(queries) / s for s in query_s[library]],
            outputs_file=save_array(opts, f"visual_retrieval-scores-{library}",
                                    scores[library])))
    return results


def report_lines(rows) -> list[str]:
    """pooler's ratio to transformers round by round (pages/s; queries/s one at a time), the
    query p50/p99 of each, and each library's index phases per page."""
    lines = []
    by_side = {r.side: r for r in rows if not r.error}
    for kind, what in (("index", "pages/s"), ("query", "queries/s one at a time")):
        pooler, peer = (by_side.get(row_name(kind, lib)) for lib in LIBRARIES)
        if pooler is None or peer is None or not peer.rounds_per_s:
            continue
        per_round = [a / b for a, b in zip(pooler.rounds_per_s, peer.rounds_per_s)]
        rates = ", ".join(f"{r.side.split()[-1]} {r.texts_per_s:.3g}" for r in (pooler, peer))
        line = (f"visual_retrieval: {pooler.side} vs {peer.side}: "
                f"{statistics.median(per_round):.2f}x {what} ({rates}; median of "
                f"{len(per_round)} alternating round(s) in one process: "
                + ", ".join(f"{x:.2f}" for x in per_round) + ")")
        if kind == "query" and pooler.p50_ms and peer.p50_ms:
            line += (f"; p50 {pooler.p50_ms:.1f} vs {peer.p50_ms:.1f} ms, "
                     f"p99 {pooler.p99_ms:.1f} vs {peer.p99_ms:.1f} ms")
        lines.append(line)
    for library in LIBRARIES:
        row = by_side.get(row_name("index", library))
        if row is None or not row.phases_s or not row.texts_per_s:
            continue
        n = row.texts_per_s * row.seconds
        split = ", ".join(f"{p} {1e3 * s / n:.0f} ms ({100 * s / row.seconds:.0f}%)"
                          for p, s in row.phases_s.items())
        tower = ""
        if row.model_ceiling_pct is not None:
            tower = (f"; vision tower {row.model_flops / n / 1e9:.0f} GFLOP/page = "
                     f"{row.model_ceiling_pct:.0f}% of the fp32 GEMM ceiling over the model "
                     f"phase ({row.ceiling_pct:.0f}% end to end)")
        lines.append(f"visual_retrieval: {row.side} per page: {split}{tower}")
    return lines


register(Workload(
    name="visual_retrieval",
    description="index page images with ColModernVBert (pages/s) and answer text queries by "
                "MaxSim (p50/p99 latency): pooler vs transformers, alternating rounds in one "
                "process",
    metric="throughput", sides=lambda opts: [Side(MODEL, "pooler", _run)], baseline="",
    baselines={row_name(kind, "pooler"): row_name(kind, "transformers")
               for kind in ("index", "query")},
    report_lines=report_lines))
