"""`pooler serve --ray` as a user starts it: the command in a process of its own, which starts
a single-node Ray with this machine's CPUs and two replicas. Answers equal the offline Engine's
on both replicas; SIGKILL of one replica's process under load leaves no request hanging, fails
at most the requests in flight, and Serve starts a replacement."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from pooler.engine.llm import Engine
from pooler.ray.serve import REPLICA_HEADER
from tests.batch.conftest import corpus_texts
from tests.ray.load_under_kill import assert_only_in_flight_lost, load_through_kill

REPO = Path(__file__).resolve().parents[2]
CLIENTS = 4
REQUEST_TIMEOUT_S = 15  # --request-timeout: bounds a request lost in a replica's death


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parent(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # after "pid (comm) state": the ppid


def replica_pids(server: subprocess.Popen) -> list[int]:
    """The Serve replica processes started by this server (its Ray runs under it), from /proc:
    other Ray instances on the machine have replicas too."""
    parents = {int(p): _parent(p) for p in os.listdir("/proc") if p.isdigit()}
    pids = []
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, server.pid):
            ancestor = parents.get(ancestor)
        if ancestor != server.pid:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ServeReplica" in cmdline:
            pids.append(pid)
    return pids


def embed(client: httpx.Client, texts: list[str]) -> tuple[np.ndarray, str]:
    r = client.post("/v1/embeddings", json={"input": texts})
    r.raise_for_status()
    return np.array([d["embedding"] for d in r.json()["data"]]), r.headers[REPLICA_HEADER]


@pytest.fixture
def server(tiny_embedder, tmp_path):
    if (os.cpu_count() or 1) < 2:
        pytest.skip("two replicas of one CPU need two CPUs")
    if not Path("/proc/self/stat").exists():
        pytest.skip("finds the replica processes in /proc (Linux)")
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pooler", "serve", str(tiny_embedder), "--ray", "--replicas", "2",
         "--host", "127.0.0.1", "--port", str(port), "--request-timeout", str(REQUEST_TIMEOUT_S)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "pooler serve --ray did not answer in 300 s"
            time.sleep(1)
        yield proc, url
    finally:
        proc.send_signal(signal.SIGINT)  # the command's own shutdown: delete the app, stop Ray
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its Ray is left
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


def test_serve_ray_two_replicas_and_a_killed_one(server, tiny_embedder):
    proc, url = server
    texts = corpus_texts(16, seed=41)
    want = np.stack([o.embedding for o in Engine(str(tiny_embedder)).embed(texts)])
    replicas: set[str] = set()
    deadline = time.monotonic() + 240
    with httpx.Client(base_url=url, timeout=60) as client:
        while len(replicas) < 2:  # the second replica may still be loading
            assert time.monotonic() < deadline, f"only replicas {replicas} answered"
            got, replica = embed(client, texts)
            np.testing.assert_allclose(got, want, atol=1e-5)
            replicas.add(replica)
        bad = client.post("/v1/embeddings", json={"input": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    pids = replica_pids(proc)
    assert len(pids) == 2, pids

    before, results = load_through_kill(url, texts, want, clients=CLIENTS,
                                        kill=lambda: os.kill(pids[0], signal.SIGKILL))
    outcomes = [o for _, o in results]
    print("outcomes:", {o: outcomes.count(o) for o in set(outcomes)})
    assert before > 0 and outcomes.count("ok") > before  # the other replica kept serving
    assert_only_in_flight_lost(results, CLIENTS, REQUEST_TIMEOUT_S)

    # Serve replaces the killed replica: two replicas answer again, one of them new.
    deadline = time.monotonic() + 240
    seen: set[str] = set()
    with httpx.Client(base_url=url, timeout=60) as client:
        while not (len(seen) >= 2 and seen - replicas):
            assert time.monotonic() < deadline, f"no replacement replica: {seen}"
            got, replica = embed(client, texts)
            np.testing.assert_allclose(got, want, atol=1e-5)
            seen.add(replica)
            if len(replica_pids(proc)) < 2:
                time.sleep(1)
