"""Soak: many varied requests in a row, then many concurrent ColBERT scoring calls of which
some clients hang up early. Afterwards the server must hold no request state (no queued
tokens, no cached ColBERT query, no pending document), have answered every call it kept, and
its RSS must stay flat (slope per 1,000 requests).

    python -m pooler.bench.soak [--sequential 5000] [--concurrent 1000]

serves all-MiniLM-L6-v2 (sequential phase) and a MiniLM-based ColBERT folder (concurrent
phase) in this process, on loopback ports. tests/server/test_soak.py runs it smaller.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import numpy as np

from pooler.bench.corpus import mixed_corpus
from pooler.bench.machine import rss_mb


@dataclass
class SoakReport:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    rss_samples: list[tuple[int, float]] = field(default_factory=list)  # (requests, MB)
    disconnected: int = 0
    answered: int = 0
    idle_state: dict = field(default_factory=dict)

    def rss_slope_per_1000(self) -> float:
        """Least-squares slope of RSS (MB) against requests served, per 1,000 requests."""
        if len(self.rss_samples) < 2:
            return 0.0
        x, y = np.array(self.rss_samples, dtype=float).T
        return float(np.polyfit(x, y, 1)[0] * 1000)

    def summary(self) -> dict:
        return {"requests": self.requests, "errors": len(self.errors),
                "first_errors": self.errors[:3], "answered": self.answered,
                "disconnected": self.disconnected,
                "rss_first_mb": round(self.rss_samples[0][1]) if self.rss_samples else None,
                "rss_last_mb": round(self.rss_samples[-1][1]) if self.rss_samples else None,
                "rss_slope_mb_per_1000": round(self.rss_slope_per_1000(), 2),
                "idle_state": self.idle_state}


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


def sequential(url: str, count: int, report: SoakReport, samples: int = 10,
               seed: int = 0) -> None:
    """`count` requests one after another over the embedding routes, 1-32 texts of varied
    length each; RSS sampled `samples` times along the way."""
    import httpx

    rng = random.Random(seed)
    pool = mixed_corpus(512)
    routes = [("/v1/embeddings", "input"), ("/embed", "inputs"), ("/pooling", "input")]
    every = max(1, count // samples)
    with httpx.Client(base_url=url, timeout=120) as http:
        for i in range(count):
            route, field_name = routes[i % len(routes)]
            texts = rng.sample(pool, rng.choice((1, 1, 2, 4, 8, 16, 32)))
            body = {field_name: texts}
            if route == "/embed":
                body["truncate"] = True  # TEI's default is to refuse over-long inputs
            r = http.post(route, json=body)
            report.requests += 1
            if r.status_code != 200:
                report.errors.append(f"{route} {r.status_code}: {r.text[:200]}")
            else:
                report.answered += 1
            if i % every == 0 or i == count - 1:
                report.rss_samples.append((i + 1, rss_mb()))


async def concurrent_colbert(url: str, count: int, report: SoakReport,
                             disconnect_share: float = 0.2, concurrency: int = 64,
                             seed: int = 0) -> None:
    """`count` /rerank calls (1 query x 4-16 documents), `concurrency` at a time; a random
    `disconnect_share` of the clients hang up after a random 0-200 ms."""
    import httpx

    rng = random.Random(seed)
    pool = mixed_corpus(256)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, i: int) -> None:
        body = {"query": pool[i % len(pool)][:80],
                "documents": rng.sample(pool, rng.randint(4, 16))}
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
                    return
            try:
                r = await call
            except httpx.HTTPError as exc:
                report.errors.append(f"/rerank {type(exc).__name__}")
                return
            report.requests += 1
            if r.status_code == 200 and len(r.json()["results"]) == len(body["documents"]):
                report.answered += 1
            else:
                report.errors.append(f"/rerank {r.status_code}: {r.text[:200]}")

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await asyncio.gather(*(one(http, i) for i in range(count)))


def main(argv: list[str] | None = None) -> int:
    from pooler.bench.workloads.colbert import model_path as colbert_model
    from pooler.engine.llm import Engine
    from pooler.server.settings import ServerSettings

    p = argparse.ArgumentParser(prog="python -m pooler.bench.soak", description=__doc__)
    p.add_argument("--sequential", type=int, default=5000)
    p.add_argument("--concurrent", type=int, default=1000)
    args = p.parse_args(argv)
    from pooler.bench.serve_thread import serve_in_thread

    out = {}
    settings = ServerSettings(max_queue_tokens=10**7)  # the soak measures leaks, not refusals
    engine = Engine()
    with serve_in_thread(engine, settings) as url:
        report = SoakReport()
        sequential(url, args.sequential, report)
        report.idle_state = wait_idle(engine)
        out["sequential"] = report.summary()
    engine.shutdown()
    colbert = Engine(str(colbert_model()))
    with serve_in_thread(colbert, settings) as url:
        report = SoakReport()
        report.rss_samples.append((0, rss_mb()))
        asyncio.run(concurrent_colbert(url, args.concurrent, report))
        report.idle_state = wait_idle(colbert)
        report.rss_samples.append((args.concurrent, rss_mb()))
        out["concurrent_colbert"] = report.summary()
    colbert.shutdown()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
