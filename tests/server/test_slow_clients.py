"""Slow and vanished clients (issue 18, item 2): a few hundred connections dribbling their
request head or body must not delay normal requests, and are closed after the timeout.

The server runs in-process under the same protocol and middleware `pooler serve` uses
(guarded_h11_protocol, BodyTimeoutMiddleware), with 1.5 s header/body timeouts so the test
takes seconds. Bound stated: every normal request answers within NORMAL_BOUND s while the
dribblers are connected; every dribbler is closed within its timeout + CLOSE_SLACK s.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import threading
import time

import httpx
import pytest

from pooler.server.settings import ServerSettings
from tests.server.conftest import free_port
from tests.server.health import wait_until_healthy

TIMEOUT = 1.5
NORMAL_BOUND = 3.0
CLOSE_SLACK = 2.5
HEAD_DRIBBLERS = 150
BODY_DRIBBLERS = 150


@contextlib.contextmanager
def guarded_server(engine, settings: ServerSettings, max_connections: int):
    """`pooler serve`'s uvicorn setup (see pooler/cli/serve.py) in a thread."""
    import uvicorn

    from pooler.server.app import create_app
    from pooler.server.edges.connection_limits import guarded_h11_protocol
    from pooler.server.edges.shutdown import GracefulServer

    app = create_app(engine, settings, owns_engine=False)
    state = app.state.pooler
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            http=guarded_h11_protocol(max_connections, settings.header_timeout,
                                                      state.metrics),
                            timeout_keep_alive=settings.keep_alive_timeout,
                            timeout_graceful_shutdown=5, backlog=2048)
    server = GracefulServer(config, state.shutdown, 2.0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, 60, thread.is_alive)
        yield url, port, app
    finally:
        server.should_exit = True
        thread.join(30)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _dribble(port: int, head_only: bool, results: list, stop_at: float) -> None:
    """Connect, send part of a request, then one byte every 0.2 s until the server closes
    the connection. Records (seconds until closed or None, status line)."""
    start = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"input": "' + b"x" * 200 + b'"}'
    if head_only:
        chunks = [b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n"] + [b"x-a: b\r\n"] * 400
    else:
        head = (b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n")
        chunks = [head] + [body[i:i + 1] for i in range(len(body))]
    status = b""
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.2)
            except asyncio.TimeoutError:
                if time.monotonic() > stop_at:
                    break
                continue
            status = data.split(b"\r\n", 1)[0]
            if not data or status:
                # The server answered (408) or closed: read to EOF.
                while data:
                    data = await asyncio.wait_for(reader.read(4096), 5)
                results.append((time.monotonic() - start, status))
                return
        results.append((None, status))
    except (ConnectionError, OSError):
        results.append((time.monotonic() - start, status))
    finally:
        writer.close()


def test_dribblers_are_closed_and_normal_requests_answer(engine):
    settings = ServerSettings(header_timeout=TIMEOUT, body_timeout=TIMEOUT)
    with guarded_server(engine, settings, max_connections=1000) as (url, port, app):
        fds_before = _open_fds()
        peak = {"fds": fds_before}
        results: list = []
        latencies: list[float] = []

        async def main():
            stop_at = time.monotonic() + TIMEOUT + CLOSE_SLACK + 5
            tasks = [asyncio.ensure_future(_dribble(port, i < HEAD_DRIBBLERS, results, stop_at))
                     for i in range(HEAD_DRIBBLERS + BODY_DRIBBLERS)]
            await asyncio.sleep(0.5)  # all dribbling now
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for i in range(10):
                    sent = time.monotonic()
                    r = await client.post("/v1/embeddings", json={"input": [f"normal {i}"] * 4})
                    latencies.append(time.monotonic() - sent)
                    assert r.status_code == 200
                    peak["fds"] = max(peak["fds"], _open_fds())
            await asyncio.gather(*tasks)

        asyncio.run(main())
        metrics = httpx.get(f"{url}/metrics").text

    print(f"\nnormal request latency under {HEAD_DRIBBLERS + BODY_DRIBBLERS} dribblers: "
          f"max {max(latencies):.3f} s, mean {sum(latencies) / len(latencies):.3f} s; "
          f"fds at peak {peak['fds']} (before {fds_before}, ulimit -n "
          f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]})")
    assert max(latencies) < NORMAL_BOUND, latencies
    assert len(results) == HEAD_DRIBBLERS + BODY_DRIBBLERS
    unclosed = [r for r in results if r[0] is None]
    assert not unclosed, f"{len(unclosed)} dribblers were never closed"
    slowest = max(r[0] for r in results)
    assert slowest < TIMEOUT + CLOSE_SLACK, slowest
    statuses = {r[1] for r in results}
    assert statuses <= {b"HTTP/1.1 408 Request Timeout", b""}, statuses
    assert f'pooler_http_client_timeouts_total{{phase="headers"}} {HEAD_DRIBBLERS}.0' in metrics
    assert f'pooler_http_client_timeouts_total{{phase="body"}} {BODY_DRIBBLERS}.0' in metrics
    # The body timeouts are 408s, never 5xx.
    assert 'status="5' not in metrics


def test_connections_above_the_cap_are_refused_at_once(engine):
    settings = ServerSettings(header_timeout=5, body_timeout=5)
    with guarded_server(engine, settings, max_connections=20) as (url, port, app):
        async def main():
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
            await asyncio.sleep(0.2)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answer = await asyncio.wait_for(reader.read(), 2)  # 503 then EOF, at once
            writer.close()
            for _, w in conns:
                w.close()
            return answer

        answer = asyncio.run(main())
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"retry-after: 1" in answer
        time.sleep(0.3)  # the held connections are gone: normal service again
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "ok"}).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert "pooler_http_connections_rejected_total 1.0" in metrics


def test_a_newcomer_at_the_cap_evicts_the_oldest_dribbler(engine):
    """20 dribblers hold all 20 slots for more than EVICT_AFTER s: normal requests still get
    in (each evicts the oldest dribbler) and answer at once."""
    settings = ServerSettings(header_timeout=30, body_timeout=30)
    with guarded_server(engine, settings, max_connections=20) as (url, port, app):
        async def main():
            conns = []
            for i in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n" if i % 2 else
                             b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\n"
                             b"content-length: 100\r\n\r\n{")
                conns.append((reader, writer))
            await asyncio.sleep(1.5)
            latencies = []
            for _ in range(3):  # a new client (connection) each time
                async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                    sent = time.monotonic()
                    r = await c.post("/v1/embeddings", json={"input": "normal"})
                    assert r.status_code == 200, r.text
                    latencies.append(time.monotonic() - sent)
            closed = 0
            for reader, writer in conns:
                try:
                    data = await asyncio.wait_for(reader.read(), 0.2)
                    closed += 1 if data is not None else 0
                except asyncio.TimeoutError:
                    pass
                writer.close()
            return latencies, closed

        latencies, closed = asyncio.run(main())
        assert max(latencies) < NORMAL_BOUND, latencies
        assert closed >= 1  # the first newcomer evicted the oldest; the slot then frees
        metrics = httpx.get(f"{url}/metrics").text
        assert 'pooler_http_client_timeouts_total{phase="evicted"}' in metrics
        assert "pooler_http_connections_rejected_total 0.0" in metrics


def test_idle_connection_without_a_request_is_closed(engine):
    settings = ServerSettings(header_timeout=0.5)
    with guarded_server(engine, settings, max_connections=100) as (url, port, app):
        async def main():
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            started = time.monotonic()
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return data, time.monotonic() - started

        data, took = asyncio.run(main())
        assert data.startswith(b"HTTP/1.1 408"), data
        assert took < 2.0


def test_log_rate_limit_drops_a_flood():
    import logging

    from pooler.server.edges.connection_limits import RateLimitFilter

    limiter = RateLimitFilter(burst=5, interval=60)
    passed = sum(limiter.filter(logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1,
        f"socket.accept() out of system resource\nsocket: <socket fd={i}>", None, None))
        for i in range(10_000))
    assert passed == 5
    info = logging.LogRecord("asyncio", logging.INFO, __file__, 1, "fine", None, None)
    assert limiter.filter(info)


@pytest.mark.parametrize("limit, wanted, expected", [(1024, 2048, 640), (20000, 2048, 2048)])
def test_connection_cap_stays_below_the_fd_limit(limit, wanted, expected):
    from pooler.server.edges.connection_limits import fit_connection_cap

    assert fit_connection_cap(wanted, limit) == expected


def test_serve_help_documents_the_edge_flags(capsys):
    from pooler.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--graceful-timeout", "--header-timeout", "--body-timeout",
                 "--keep-alive-timeout", "--max-connections", "--show-model-path"):
        assert flag in text, flag
