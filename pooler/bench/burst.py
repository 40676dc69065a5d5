"""Admission under load against a running server (issue 28, part 3):

- steady: C closed-loop clients, each sending R requests of 1 to T texts one after another
  (a client waits for its answer before sending again); every request must be answered.
- burst: C clients each send one request of T texts at the same moment, while /health is
  polled. Every client must get an answer or a fast refusal (503/429 + Retry-After), never a
  time-out; run --bursts times, RSS read after each.

    python -m pooler.bench.burst [--steady-clients 32,64] [--steady-texts 8]
        [--steady-requests 20] [--clients 200] [--texts 64] [--bursts 2] [--timeout 60]
        [--model MODEL] [--serve-args "..."]

starts `pooler serve` in a child process (default settings), runs the steady loads, then the
bursts, reads its RSS before, at the peak and after each burst, and prints one JSON summary.
tests/server/test_overload.py runs both at a smaller size against an in-process server.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class BurstResult:
    statuses: list[int] = field(default_factory=list)      # per client; 0 = time-out/error
    seconds: list[float] = field(default_factory=list)     # per client, send to answer
    retry_after: list[str | None] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)   # /health while the burst runs
    health_failures: int = 0
    control_seconds: list[float] = field(default_factory=list)  # concurrent GET /health

    def summary(self) -> dict:
        s = np.array(self.seconds)
        ok = np.array([c == 200 for c in self.statuses])
        busy = np.array([c in (429, 503) for c in self.statuses])
        out = {"clients": len(self.statuses), "answered": int(ok.sum()),
               "refused": int(busy.sum()),
               "other": int(len(self.statuses) - ok.sum() - busy.sum()),
               "refusals_with_retry_after": sum(1 for c, r in zip(self.statuses, self.retry_after)
                                                if c in (429, 503) and r),
               "max_s": float(s.max()) if len(s) else 0.0}
        for name, mask in (("answered", ok), ("refused", busy)):
            if mask.any():
                out[f"{name}_p50_s"] = float(np.median(s[mask]))
                out[f"{name}_max_s"] = float(s[mask].max())
        out["health_failures"] = self.health_failures
        if self.control_seconds:
            out["control_health_burst_p50_s"] = float(np.median(self.control_seconds))
            out["control_health_burst_max_s"] = float(max(self.control_seconds))
        if self.health_ms:
            out["health_p50_ms"] = float(np.median(self.health_ms))
            out["health_max_ms"] = float(max(self.health_ms))
        return out


def texts_for(client: int, num_texts: int) -> list[str]:
    from pooler.bench.corpus import mixed_corpus

    pool = mixed_corpus(256)
    return [pool[(client * 7 + i) % len(pool)] for i in range(num_texts)]


async def burst(url: str, clients: int, num_texts: int, timeout: float = 120.0,
                route: str = "/v1/embeddings") -> BurstResult:
    """Bodies are encoded up front and /health is polled from its own thread, so the
    client's own work does not show up as server latency."""
    import httpx

    result = BurstResult()
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    bodies = [json.dumps({"input": texts_for(c, num_texts)}).encode() for c in range(clients)]
    done = threading.Event()

    def poll_health():
        with httpx.Client(base_url=url, timeout=timeout) as h:
            while not done.is_set():
                start = time.perf_counter()
                try:
                    ok = h.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    result.health_ms.append((time.perf_counter() - start) * 1e3)
                else:
                    result.health_failures += 1
                done.wait(0.1)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        async def one(body: bytes) -> tuple[int, float, str | None]:
            start = time.perf_counter()
            try:
                r = await http.post(route, content=body,
                                    headers={"content-type": "application/json"})
                return r.status_code, time.perf_counter() - start, r.headers.get("retry-after")
            except httpx.HTTPError:
                return 0, time.perf_counter() - start, None

        # Control: the same number of concurrent GET /health first, to show what the client
        # and the machine alone cost at this concurrency.
        async def control() -> float:
            start = time.perf_counter()
            await http.get("/health")
            return time.perf_counter() - start

        result.control_seconds = list(await asyncio.gather(*(control() for _ in bodies)))
        answers = await asyncio.gather(*(one(b) for b in bodies))
    done.set()
    poller.join()
    for status, seconds, retry in answers:
        result.statuses.append(status)
        result.seconds.append(seconds)
        result.retry_after.append(retry)
    return result


@dataclass
class SteadyResult:
    statuses: list[int] = field(default_factory=list)   # per request; 0 = time-out/error
    seconds: list[float] = field(default_factory=list)  # per request, send to answer
    texts: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict:
        s = np.array(self.seconds) if self.seconds else np.zeros(1)
        codes: dict[str, int] = {}
        for c in self.statuses:
            codes[str(c)] = codes.get(str(c), 0) + 1
        return {"requests": len(self.statuses), "texts": self.texts, "statuses": codes,
                "refused": sum(1 for c in self.statuses if c in (429, 503)),
                "p50_s": round(float(np.median(s)), 3),
                "p99_s": round(float(np.percentile(s, 99)), 3), "max_s": round(float(s.max()), 3),
                "wall_s": round(self.wall_s, 1),
                "texts_per_s": round(self.texts / self.wall_s, 1) if self.wall_s else None}


def steady_texts(rng, pool: list[str], max_texts: int) -> list[str]:
    """1 to max_texts texts; one in eight is long (three passages joined: past 256 tokens, so
    truncated to the model's maximum)."""
    out = []
    for _ in range(rng.randint(1, max_texts)):
        if rng.random() < 0.125:
            out.append(" ".join(rng.sample(pool, 3)))
        else:
            out.append(rng.choice(pool))
    return out


async def steady(url: str, clients: int, requests: int, max_texts: int,
                 timeout: float = 60.0, seed: int = 0,
                 route: str = "/v1/embeddings") -> SteadyResult:
    """Closed loop: each client sends `requests` requests one after another, no pause."""
    import random

    import httpx

    from pooler.bench.corpus import mixed_corpus

    pool = mixed_corpus(256)
    result = SteadyResult()
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        async def client(index: int) -> None:
            rng = random.Random(seed * 1000 + index)
            for _ in range(requests):
                texts = steady_texts(rng, pool, max_texts)
                start = time.perf_counter()
                try:
                    r = await http.post(route, json={"input": texts})
                    status = r.status_code
                except httpx.HTTPError:
                    status = 0
                result.statuses.append(status)
                result.seconds.append(time.perf_counter() - start)
                result.texts += len(texts) if status == 200 else 0

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        result.wall_s = time.perf_counter() - start
    return result


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pooler.bench.burst", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steady-clients", default="32,64",
                   help="closed-loop client counts, one steady run each ('' for none)")
    p.add_argument("--steady-texts", type=int, default=8, help="most texts per steady request")
    p.add_argument("--steady-requests", type=int, default=20, help="requests per steady client")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--texts", type=int, default=64)
    p.add_argument("--bursts", type=int, default=2, help="identical bursts, one after another")
    p.add_argument("--model", default=None)
    p.add_argument("--timeout", type=float, default=60.0, help="client time-out in seconds")
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--serve-args", default="", help="extra `pooler serve` arguments")
    args = p.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    cmd = [sys.executable, "-m", "pooler", "serve", "--port", str(args.port),
           "--log-level", "warning", *args.serve_args.split()]
    if args.model:
        cmd += ["--model", args.model]
    server = subprocess.Popen(cmd)
    out: dict = {"serve": " ".join(cmd[3:]), "steady": {}, "bursts": []}
    try:
        import httpx
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        httpx.post(f"{url}/v1/embeddings", json={"input": texts_for(0, 64)}, timeout=120)
        time.sleep(1.0)
        for clients in [int(c) for c in args.steady_clients.split(",") if c]:
            result = asyncio.run(steady(url, clients, args.steady_requests, args.steady_texts,
                                        args.timeout, seed=clients))
            out["steady"][f"{clients}x{args.steady_texts}"] = result.summary()
            print(json.dumps({f"steady {clients} clients": result.summary()}),
                  file=sys.stderr, flush=True)
        time.sleep(2.0)
        for _ in range(args.bursts):
            out["bursts"].append(_one_burst(server.pid, url, args))
            print(json.dumps(out["bursts"][-1]), file=sys.stderr, flush=True)
        if len(out["bursts"]) >= 2:
            first, last = out["bursts"][0], out["bursts"][-1]
            out["rss_after_last_vs_first_burst"] = round(
                last["rss_after_mb"] / first["rss_after_mb"], 3)
        out["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(out, indent=1))
    finally:
        server.terminate()
        server.wait(30)
    return 0


def _one_burst(pid: int, url: str, args) -> dict:
    before = rss_mb(pid)
    peak = [before]

    async def run():
        async def watch():
            while True:
                peak[0] = max(peak[0], rss_mb(pid))
                await asyncio.sleep(0.2)
        watcher = asyncio.ensure_future(watch())
        try:
            return await burst(url, args.clients, args.texts, args.timeout)
        finally:
            watcher.cancel()

    result = asyncio.run(run())
    time.sleep(2.0)  # the engine goes idle and trims its heap
    after = rss_mb(pid)
    summary = result.summary()
    summary.update(rss_before_mb=round(before), rss_peak_mb=round(peak[0]),
                   rss_after_mb=round(after), rss_after_vs_before=round(after / before, 3))
    return summary


if __name__ == "__main__":
    sys.exit(main())
