"""Server workload: many concurrent clients sending one short query each to POST
/v1/embeddings, on loopback. Sides: `pooler serve`, and the plain FastAPI app around
sentence-transformers a user would write (pooler/bench/st_fastapi_app.py).

Each side starts its server as a subprocess on a free port (same model, same thread count),
warms it with one request per client, drives it with asyncio + httpx (bounded by a request
count and a time limit) and always stops it. RSS columns are the server process's, not the
load generator's.

Infinity (`infinity-emb`) is not a side: `pip install --dry-run -c constraints.txt
"infinity-emb[server,torch]"` (0.0.78) would downgrade sentence-transformers to 3.4.1,
transformers to 4.57.6 and numpy to 1.26.4 in the shared environment, which the other
workloads and pooler's parity tests are pinned against."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import token_lens
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

_REPO = Path(__file__).resolve().parents[3]
_START_TIMEOUT_S = 180


def _load(opts: BenchOptions) -> tuple[list[str], int, float]:
    """(queries, concurrent clients, time limit in seconds)."""
    if opts.quick:
        return corpus.queries(16, seed=51), 4, 30.0
    n = int(opts.extra.get("server_requests", 2000))
    return (corpus.queries(n, seed=51), int(opts.extra.get("server_clients", 32)),
            float(opts.extra.get("server_seconds", 60.0)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_mb(pid: int, field: str) -> float:
    """VmRSS / VmHWM of a process in MB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _start(cmd: list[str], port: int) -> subprocess.Popen:
    import httpx

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
    env["TOKENIZERS_PARALLELISM"] = "false"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: "
                               f"{proc.stderr.read().decode()[-1500:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"server did not answer /health within {_START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stderr:
        proc.stderr.close()


async def _drive(url: str, queries: list[str], clients: int, max_seconds: float, pid: int
                 ) -> tuple[list[float], int, float, float]:
    """(latencies ms, errors, seconds, server RSS MB after warm-up)."""
    import httpx

    latencies: list[float] = []
    errors = 0
    next_index = 0
    deadline = time.monotonic() + max_seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal next_index, errors
        while next_index < len(queries) and time.monotonic() < deadline:
            query = queries[next_index]
            next_index += 1
            t0 = time.perf_counter()
            r = await http.post("/v1/embeddings", json={"input": query})
            latencies.append((time.perf_counter() - t0) * 1e3)
            if r.status_code != 200:
                errors += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        # Warm up both servers the same way: one concurrent wave of requests.
        await asyncio.gather(*(http.post("/v1/embeddings", json={"input": q})
                               for q in queries[:clients]))
        loaded = _proc_mb(pid, "VmRSS")
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - start
    return latencies, errors, seconds, loaded


def _side(name: str, role: str, command):
    def run(opts: BenchOptions) -> SideResult:
        from pooler.model_folder import resolve_model_path

        model = str(resolve_model_path(opts.model))
        queries, clients, max_seconds = _load(opts)
        port = _free_port()
        proc = _start(command(opts, model, port), port)
        try:
            latencies, errors, seconds, loaded = asyncio.run(
                _drive(f"http://127.0.0.1:{port}", queries, clients, max_seconds, proc.pid))
            peak = _proc_mb(proc.pid, "VmHWM")
        finally:
            _stop(proc)
        if errors == len(latencies):
            raise RuntimeError(f"{name}: every request failed")
        done = len(latencies)
        return SideResult(name, role, done, sum(token_lens(Path(model), queries[:done])),
                          seconds, latencies, peak_rss_mb=peak, loaded_rss_mb=loaded,
                          note=f"{clients} clients" + (f", {errors} errors" if errors else ""))
    return run


def _pooler_cmd(opts: BenchOptions, model: str, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "pooler.cli.main", "serve", model, "--port", str(port),
           "--threads", str(opts.threads), "--log-level", "warning", "--device", opts.device,
           "--dtype", opts.dtype, "--max-num-seqs", str(opts.max_num_seqs)]
    if opts.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(opts.max_num_batched_tokens)]
    return cmd


def _st_cmd(opts: BenchOptions, model: str, port: int) -> list[str]:
    return [sys.executable, "-m", "pooler.bench.st_fastapi_app", model, str(port),
            str(opts.threads)]


register(Workload(
    name="server",
    description="HTTP /v1/embeddings, concurrent clients sending one short query each, vs a "
                "plain FastAPI app around sentence-transformers (Infinity not included: its "
                "install would downgrade sentence-transformers/transformers/numpy)",
    metric="throughput",
    sides=lambda opts: [Side("pooler serve", "pooler", _side("pooler serve", "pooler",
                                                             _pooler_cmd)),
                        Side("st + FastAPI", "peer", _side("st + FastAPI", "peer", _st_cmd))],
    baseline="st + FastAPI"))
