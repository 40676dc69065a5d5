"""`pooler serve` started as a TEI container is: no arguments, TEI's environment variables only
(what deploy/kubernetes/deployment.yaml sets), a pod-name HOSTNAME."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.health import wait_until_healthy

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_from_teis_environment(minilm_path, tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "VLLM_API_KEY")}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MODEL_ID=str(minilm_path), PORT=str(port), HOSTNAME="pooler-7d9c5-xk2pq",
               MAX_CLIENT_BATCH_SIZE="3", SERVED_MODEL_NAME="minilm", JSON_OUTPUT="true",
               API_KEY="k8s-secret", HF_HUB_OFFLINE="1")
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pooler.cli.main", "serve"], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"  # HOSTNAME is a name: the default host stays
    try:
        try:
            wait_until_healthy(url, 120, lambda: proc.poll() is None, poll_interval=0.1)
        except RuntimeError as exc:
            pytest.fail(f"{exc}\n{log.read_text()}")
        auth = {"Authorization": "Bearer k8s-secret"}
        assert httpx.get(f"{url}/info").status_code == 401  # API_KEY applies
        info = httpx.get(f"{url}/info", headers=auth).json()
        assert (info["model_id"], info["max_client_batch_size"]) == ("minilm", 3)
        too_many = httpx.post(f"{url}/embed", json={"inputs": ["a", "b", "c", "d"]},
                              headers=auth)
        # TEI's answer to a batch over --max-client-batch-size: 422 Validation
        assert too_many.status_code == 422 and too_many.json()["error_type"] == "Validation"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) in (0, -signal.SIGTERM)
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        records = [json.loads(line) for line in lines]  # JSON_OUTPUT: every line is JSON
        assert any("MODEL_ID" in r.get("message", "") for r in records), records[:5]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
