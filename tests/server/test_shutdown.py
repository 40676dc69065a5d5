"""Bounded shutdown (issue 18, item 1): `pooler serve` as an operator runs it, SIGTERM with 20
or 60 large embedding requests in flight and --graceful-timeout 3.

What must hold: the process exits 0 within the graceful timeout plus a few seconds; every
request is answered 200 (finished in time) or 503 with Retry-After (cut by the shutdown),
never a 500 or a hang; the cut ones were really aborted in the engine (the exit comes long
before the work they asked for could have been computed). A second signal exits at once.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.models.tiny import add_st_pooling, save_tiny_bert
from tests.server.health import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]
GRACEFUL = 3.0
# "graceful timeout + a few seconds": uvicorn's backstop is graceful + 5, ours must beat it.
EXIT_BOUND = GRACEFUL + 4.0
INPUTS_PER_REQUEST = 64
# The payload: {"input": ["alpha beta " * 100] * 64} (~200 tokens per input).
PAYLOAD = {"input": ["alpha beta " * 100] * INPUTS_PER_REQUEST}


@pytest.fixture(scope="module")
def slow_tiny_model(tmp_path_factory, minilm_path):
    """A seeded random 8-layer BERT (hidden 256): 20 of the issue's requests (164k tokens
    after the 128-token truncation) take tens of seconds on a CI machine, so work is really
    cut at 3 s, while one engine step (--max-num-batched-tokens 1024) stays well under 1 s
    (a forward pass in progress cannot be interrupted, so it bounds the exit). With 4 layers,
    once large steps ran in the C layer stack, a loaded CI machine finished the first of 60
    requests before the last was admitted, and the test never saw all 60 in flight."""
    folder = save_tiny_bert(tmp_path_factory.mktemp("shutdown-model"), minilm_path,
                            hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                            intermediate_size=1024, max_position_embeddings=512)
    add_st_pooling(folder, "mean", normalize=True)
    return folder


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model: Path, *extra: str):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pooler.cli.main", "serve", str(model), "--port", str(port),
         "--graceful-timeout", str(GRACEFUL), "--max-num-batched-tokens", "1024",
         # Every request is meant to be in flight at the signal: no admission refusals.
         "--max-queue-tokens", "100000000", "--log-level", "warning", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, 120, lambda: proc.poll() is None, poll_interval=0.1)
    except RuntimeError as exc:
        proc.kill()
        pytest.fail(f"{exc}\n{proc.stdout.read().decode()}")
    return proc, url


def _fire(url: str, n: int) -> tuple[list[threading.Thread], list]:
    results: list = [None] * n

    def call(i):
        try:
            results[i] = httpx.post(f"{url}/v1/embeddings", json=PAYLOAD, timeout=60)
        except Exception as exc:  # a reset or a hang is a failure the test reports
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _wait_in_flight(url: str, inputs: int, timeout: float = 60) -> None:
    """Until the server has admitted `inputs` inputs (all requests really in flight)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = httpx.get(f"{url}/metrics", timeout=10).text
        except httpx.TimeoutException:  # the loop is busy parsing the bodies: ask again
            continue
        match = re.search(r"^pooler_inputs_in_flight (\S+)$", text, re.M)
        if match and float(match.group(1)) >= inputs:
            return
        time.sleep(0.05)
    pytest.fail(f"{inputs} inputs never got in flight")


@pytest.mark.parametrize("in_flight", [20, 60])
def test_sigterm_with_requests_in_flight_exits_in_bounded_time(slow_tiny_model, in_flight):
    proc, url = _start(slow_tiny_model)
    try:
        threads, results = _fire(url, in_flight)
        _wait_in_flight(url, in_flight * INPUTS_PER_REQUEST)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(EXIT_BOUND + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit {EXIT_BOUND + 20:g} s after SIGTERM")
        took = time.monotonic() - sent
        for t in threads:
            t.join(10)
        log = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"\n{in_flight} in flight: exit {code} after {took:.2f} s "
          f"(graceful {GRACEFUL:g} s)")
    assert code == 0, log
    assert took < EXIT_BOUND, f"exit took {took:.2f} s\n{log}"
    errors = [r for r in results if not isinstance(r, httpx.Response)]
    assert not errors, errors[:3]
    statuses = sorted(r.status_code for r in results)
    print(f"statuses: 200 x {statuses.count(200)}, 503 x {statuses.count(503)}")
    assert set(statuses) <= {200, 503}, statuses
    # The load is sized so that not everything can finish in 3 s: some were cut.
    assert statuses.count(503) > 0, statuses
    for r in results:
        if r.status_code == 200:
            assert len(r.json()["data"]) == INPUTS_PER_REQUEST
        else:
            assert r.headers["retry-after"] == "1"
            # /v1/embeddings answers in vLLM's error shape: code is the HTTP status.
            error = r.json()["error"]
            assert error["code"] == 503 and "shutting down" in error["message"]
    assert "Traceback" not in log, log


def test_second_signal_exits_at_once(slow_tiny_model):
    proc, url = _start(slow_tiny_model)
    try:
        threads, _ = _fire(url, 20)
        _wait_in_flight(url, 20 * INPUTS_PER_REQUEST)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + signal.SIGTERM
    assert took < 1.5, took


def test_sigterm_when_idle_exits_zero(slow_tiny_model):
    proc, url = _start(slow_tiny_model)
    try:
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "hello"}).status_code == 200
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0
