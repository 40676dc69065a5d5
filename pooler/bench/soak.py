"""Soak: many varied requests in a row, then many concurrent ColBERT scoring calls of which
some clients hang up early. Afterwards the server must hold no request state (no queued
tokens, no cached ColBERT query, no pending document, and /metrics must say so), have
answered every call it kept, and its RSS must stay flat (slope per 1,000 requests after a
warm-up).

    python -m pooler.bench.soak [--sequential 5000] [--concurrent 1000]

serves all-MiniLM-L6-v2 (sequential phase) and a MiniLM-based ColBERT folder (concurrent
phase) in this process, on loopback ports. tests/server/test_soak.py runs it smaller.

RSS slope: least-squares fit of RSS (MB) against requests served, over the samples taken
after the warm-up (the first `--warmup` share of the requests: the per-shape kernel caches
fill there, see pooler/worker/memory.py), times 1,000.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import gc
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from pooler.bench.corpus import mixed_corpus
from pooler.bench.machine import rss_mb
from pooler.worker.memory import heap_in_use_mb

# Texts per sequential request: mostly small requests, some large ones (1 to 32 texts).
SEQUENTIAL_SIZES = (1, 1, 2, 4, 8, 16, 32)
RERANK_DOCUMENTS = (4, 16)  # documents per ColBERT /rerank call, at random in this range


@dataclass
class SoakReport:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    rss_samples: list[tuple[int, float]] = field(default_factory=list)  # (requests, MB)
    # Live malloc heap (pooler.worker.memory.heap_in_use_mb) at the same moments: RSS also
    # holds free heap the trimmer has not returned yet, this is what the process keeps.
    heap_samples: list[tuple[int, float]] = field(default_factory=list)  # (requests, MB)
    rss_idle_mb: float | None = None  # after the phase, once the engine went idle
    disconnected: int = 0  # clients that hung up before their answer
    answered: int = 0
    idle_state: dict = field(default_factory=dict)
    idle_metrics: dict = field(default_factory=dict)

    progress: bool = False  # print each sample to stderr (long runs)

    def sample(self, served: int) -> None:
        self.rss_samples.append((served, rss_mb()))
        heap = heap_in_use_mb()
        if heap is not None:
            self.heap_samples.append((served, heap))
        if self.progress:
            print(json.dumps({"served": served, "rss_mb": round(self.rss_samples[-1][1], 1),
                              "heap_mb": None if heap is None else round(heap, 1),
                              "errors": len(self.errors), "disconnected": self.disconnected,
                              "time": time.strftime("%H:%M:%S")}), file=sys.stderr, flush=True)

    def rss_slope_per_1000(self, after: int = 0, heap: bool = False) -> float:
        """Least-squares slope of RSS (MB; heap: of the live heap) against requests served,
        per 1,000 requests, over the samples taken once `after` requests were served."""
        samples = self.heap_samples if heap else self.rss_samples
        points = [(n, mb) for n, mb in samples if n >= after]
        if len(points) < 2:
            return 0.0
        x, y = np.array(points, dtype=float).T
        return float(np.polyfit(x, y, 1)[0] * 1000)

    def summary(self, warmup: int = 0) -> dict:
        rss = [mb for _, mb in self.rss_samples]
        return {"requests": self.requests, "errors": len(self.errors),
                "first_errors": self.errors[:3], "answered": self.answered,
                "disconnected": self.disconnected,
                "rss_start_mb": round(rss[0]) if rss else None,
                "rss_peak_mb": round(max(rss)) if rss else None,
                "rss_end_mb": round(rss[-1]) if rss else None,
                "rss_idle_mb": None if self.rss_idle_mb is None else round(self.rss_idle_mb),
                "rss_samples": len(rss), "warmup_requests": warmup,
                "rss_slope_mb_per_1000": round(self.rss_slope_per_1000(), 2),
                "rss_slope_mb_per_1000_after_warmup": round(self.rss_slope_per_1000(warmup), 2),
                "heap_start_mb": round(self.heap_samples[0][1]) if self.heap_samples else None,
                "heap_end_mb": round(self.heap_samples[-1][1]) if self.heap_samples else None,
                "heap_slope_mb_per_1000_after_warmup": round(
                    self.rss_slope_per_1000(warmup, heap=True), 2),
                "idle_state": self.idle_state, "idle_metrics": self.idle_metrics}


def idle_state(engine) -> dict:
    """What must be empty once nothing is in flight."""
    late = engine.core.model_runner.pooling_runner.late_interaction
    return {"queued_tokens": engine.num_queued_tokens,
            "cached_queries": late.num_cached_queries,
            "pending_docs": late.num_pending_docs,
            "scheduler_requests": len(engine.core.scheduler.requests)}


def wait_idle(engine, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    state = idle_state(engine)
    while any(state.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = idle_state(engine)
    return state


def scrape_idle_metrics(url: str) -> dict:
    """From /metrics: the late-interaction cache gauges (all must be 0 at idle), the engine
    queue gauges, and how many answers the server counted as 499 (client gone)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out = {"client_closed_499": 0}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("pooler_late_interaction_", "pooler_engine_")):
                out[sample.name] = sample.value
            elif (sample.name == "pooler_http_requests_total"
                  and sample.labels.get("status") == "499"):
                out["client_closed_499"] += int(sample.value)
    return out


def sequential(url: str, count: int, report: SoakReport, samples: int = 10,
               seed: int = 0, sizes: tuple[int, ...] = SEQUENTIAL_SIZES) -> None:
    """`count` requests one after another over the embedding routes, each of a number of
    texts drawn from `sizes` (texts of 5-250 words); RSS sampled `samples` times along the
    way (and before the first and after the last request)."""
    import httpx

    rng = random.Random(seed)
    pool = mixed_corpus(512)
    routes = [("/v1/embeddings", "input"), ("/embed", "inputs"), ("/pooling", "input")]
    every = max(1, count // samples)
    with httpx.Client(base_url=url, timeout=120) as http:
        report.sample(report.requests)
        for i in range(count):
            route, field_name = routes[i % len(routes)]
            texts = rng.sample(pool, rng.choice(sizes))
            body = {field_name: texts}
            if route == "/embed":
                body["truncate"] = True  # TEI's default is to refuse over-long inputs
            r = http.post(route, json=body)
            report.requests += 1
            if r.status_code != 200:
                report.errors.append(f"{route} {r.status_code}: {r.text[:200]}")
            else:
                report.answered += 1
            if (i + 1) % every == 0 or i == count - 1:
                report.sample(report.requests)


async def concurrent_colbert(url: str, count: int, report: SoakReport,
                             disconnect_share: float = 0.2, concurrency: int = 64,
                             seed: int = 0, samples: int = 10,
                             documents: tuple[int, int] = RERANK_DOCUMENTS) -> None:
    """`count` /rerank calls (1 query x `documents` documents), `concurrency` at a time; a random
    `disconnect_share` of the clients hang up after a random 0-200 ms. RSS is sampled every
    count / `samples` finished calls."""
    import httpx

    rng = random.Random(seed)
    pool = mixed_corpus(256)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    every = max(1, count // samples)
    finished = 0
    report.sample(0)

    def done() -> None:
        nonlocal finished
        finished += 1
        if finished % every == 0:
            report.sample(finished)

    async def one(http: httpx.AsyncClient, i: int) -> None:
        body = {"query": pool[i % len(pool)][:80],
                "documents": rng.sample(pool, rng.randint(*documents))}
        leave = rng.random() < disconnect_share
        async with gate:
            call = asyncio.ensure_future(http.post("/rerank", json=body))
            if leave:
                await asyncio.sleep(rng.random() * 0.2)
                if not call.done():
                    call.cancel()  # closes the connection: the server sees a disconnect
                    report.disconnected += 1
                    try:
                        await call
                    except (asyncio.CancelledError, httpx.HTTPError):
                        pass
                    return done()
            try:
                r = await call
            except httpx.HTTPError as exc:
                report.errors.append(f"/rerank {type(exc).__name__}")
                return done()
            report.requests += 1
            if r.status_code == 200 and len(r.json()["results"]) == len(body["documents"]):
                report.answered += 1
            else:
                report.errors.append(f"/rerank {r.status_code}: {r.text[:200]}")
            done()

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(*(one(http, i) for i in range(count)))


def settle(engine, url: str, report: SoakReport) -> None:
    """After a phase: wait for idle, let the engine's idle trim run, read RSS and /metrics."""
    report.idle_state = wait_idle(engine)
    time.sleep(2.0)  # the engine loop trims the heap when it goes idle (worker/memory.py)
    report.rss_idle_mb = rss_mb()
    report.idle_metrics = scrape_idle_metrics(url)


def main(argv: list[str] | None = None) -> int:
    from pooler.bench.workloads.colbert import model_path as colbert_model
    from pooler.engine.llm import Engine
    from pooler.server.settings import ServerSettings

    p = argparse.ArgumentParser(prog="python -m pooler.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequential", type=int, default=5000)
    p.add_argument("--concurrent", type=int, default=1000)
    p.add_argument("--warmup", type=float, default=0.2,
                   help="share of each phase's requests before the RSS slope is fitted")
    p.add_argument("--samples", type=int, default=100, help="RSS samples per phase")
    p.add_argument("--disconnect-share", type=float, default=0.2)
    p.add_argument("--sizes", default=",".join(map(str, SEQUENTIAL_SIZES)),
                   help="texts per sequential request, drawn at random from this list")
    p.add_argument("--documents", default="%d,%d" % RERANK_DOCUMENTS,
                   help="min,max documents per ColBERT /rerank call")
    args = p.parse_args(argv)
    sizes = tuple(int(v) for v in args.sizes.split(","))
    low, high = (int(v) for v in args.documents.split(","))
    from pooler.bench.serve_thread import serve_in_thread

    out = {}
    settings = ServerSettings(max_queue_tokens=10**7)  # the soak measures leaks, not refusals
    started = time.monotonic()
    engine = Engine()
    with serve_in_thread(engine, settings) as url:
        report = SoakReport(progress=True)
        sequential(url, args.sequential, report, samples=args.samples, sizes=sizes)
        settle(engine, url, report)
        out["sequential"] = report.summary(int(args.sequential * args.warmup))
    engine.shutdown()
    del engine
    gc.collect()  # the ColBERT phase starts without the first model's memory
    out["sequential"]["seconds"] = round(time.monotonic() - started)
    started = time.monotonic()
    colbert = Engine(str(colbert_model()))
    with serve_in_thread(colbert, settings) as url:
        report = SoakReport(progress=True)
        asyncio.run(concurrent_colbert(url, args.concurrent, report, samples=args.samples,
                                       disconnect_share=args.disconnect_share,
                                       documents=(low, high)))
        settle(colbert, url, report)
        out["concurrent_colbert"] = report.summary(int(args.concurrent * args.warmup))
    colbert.shutdown()
    out["concurrent_colbert"]["seconds"] = round(time.monotonic() - started)
    out["command"] = "python -m pooler.bench.soak " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
