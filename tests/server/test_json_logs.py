"""`pooler serve --log-format json` as an operator runs it (a subprocess with the operating
flags): every line on stdout is one JSON object, and each request, HTTP or gRPC, has one with
its request id, route, status, tokens and durations. The JSON formatter is also checked on
its own (extra fields, exceptions)."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pooler.server.observability.json_logs import JSONFormatter
from tests.server.health import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_formatter_writes_one_object_with_extras():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("pooler.x").makeRecord(
            "pooler.x", logging.ERROR, __file__, 7, "failed %s", ("here",),
            sys.exc_info(), extra={"request_id": "abc", "tokens": 3})
    line = JSONFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "failed here" and entry["level"] == "ERROR"
    assert entry["target"] == "pooler.x" and entry["line_number"] == 7
    assert entry["request_id"] == "abc" and entry["tokens"] == 3
    assert "ValueError: boom" in entry["exception"]
    assert entry["timestamp"].endswith("Z")


def test_serve_json_logs_metrics_port_and_grpc(minilm_path):
    grpc = pytest.importorskip("grpc")
    from pooler.server.grpc.generated import tei_pb2 as pb, tei_pb2_grpc as pb_grpc

    port, metrics_port, grpc_port = _free_port(), _free_port(), _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pooler.cli.main", "serve", str(minilm_path), "--port", str(port),
         "--log-format", "json", "--prometheus-port", str(metrics_port),
         "--grpc-port", str(grpc_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_healthy(url, 120, lambda: proc.poll() is None, poll_interval=0.1)
        except RuntimeError as exc:
            pytest.fail(f"{exc}\n{proc.stderr.read().decode() if proc.poll() is not None else ''}")
        assert httpx.post(f"{url}/embed", json={"inputs": ["a", "b c"]},
                          headers={"x-request-id": "req-42"}).status_code == 200
        assert httpx.post(f"{url}/embed", json={"inputs": []}).status_code == 400
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            answer = pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="over grpc"))
        assert len(answer.embeddings) == 384
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "te_request_success{" in scraped and "vllm:request_success_total{" in scraped
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in out.decode().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert entries and all({"timestamp", "level", "message", "target"} <= set(e)
                           for e in entries)
    requests = [e for e in entries if e["target"] == "pooler.request"]
    by_id = {e["request_id"]: e for e in requests}
    ok = by_id["req-42"]
    assert ok["route"] == "/embed" and ok["status"] == 200 and ok["inputs"] == 2
    assert ok["tokens"] > 2
    for key in ("total_time", "tokenization_time", "queue_time", "inference_time"):
        assert isinstance(ok[key], float) and ok[key] >= 0, key
    assert ok["total_time"] >= ok["inference_time"]
    assert any(e["status"] == 400 and e["route"] == "/embed" for e in requests)
    over_grpc = [e for e in requests if e.get("grpc_method") == "tei.v1.Embed/Embed"]
    assert len(over_grpc) == 1 and over_grpc[0]["status"] == 200
    # Probes and scrapes are not logged; uvicorn's own records are JSON too.
    assert not any(e["route"] in ("/health", "/metrics") for e in requests)
    assert any(e["target"].startswith("uvicorn") for e in entries)
