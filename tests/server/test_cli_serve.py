"""`pooler serve` as a user runs it: a subprocess, real flags, SIGTERM finishes in-flight work."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from pooler.cli.main import build_parser
from tests.server.health import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--host", "--port", "--api-key", "--served-model-name",
                 "--max-num-batched-tokens", "--max-num-seqs", "--task", "--runner",
                 "--max-input-items", "--max-payload-bytes", "--max-queue", "MODEL"):
        assert flag in text, flag
    assert "127.0.0.1" in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_subprocess_and_graceful_sigterm(minilm_path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pooler.cli.main", "serve", str(minilm_path), "--port", str(port),
         "--served-model-name", "minilm", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_healthy(url, 120, lambda: proc.poll() is None, poll_interval=0.1)
        except RuntimeError as exc:
            output = proc.stdout.read().decode() if proc.poll() is not None else ""
            pytest.fail(f"{exc}\n{output}")
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "minilm"

        # An in-flight request when SIGTERM arrives still gets its full answer.
        texts = [f"graceful shutdown text {i} with a few words" for i in range(1500)]
        result = {}

        def call():
            result["r"] = httpx.post(f"{url}/v1/embeddings", json={"input": texts,
                                                                  "model": "minilm"}, timeout=120)

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        thread.join(120)
        assert result["r"].status_code == 200
        assert len(result["r"].json()["data"]) == len(texts)
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
        assert proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
