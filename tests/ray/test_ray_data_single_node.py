"""`pooler batch --ray` on the machine shape users have: one node whose logical CPUs are the
machine's real CPUs (`ray.init(num_cpus=os.cpu_count())`), in a process of its own
(tests/ray/job_driver.py). --replicas equal to the CPU count runs to the end with the offline
Engine's vectors (the engine actors leave room for the read tasks), one more replica is refused
at once naming the CPUs, and a job that can make no progress stops with a clear error within its
stall timeout instead of hanging."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pooler.engine.llm import Engine
from tests.batch.conftest import corpus_texts, write_jsonl

REPO = Path(__file__).resolve().parents[2]


def test_replicas_equal_to_cpus_on_one_node(tiny_embedder, tmp_path):
    texts = corpus_texts(90, seed=31)
    rows = [{"doc": f"d{i}", "text": t} for i, t in enumerate(texts)]
    rows[7]["text"] = ""
    source = write_jsonl(tmp_path / "corpus.jsonl", rows)
    out = tmp_path / "out"
    args = ["--model", str(tiny_embedder), "--input", str(source), "--id-column", "doc",
            "--output", str(out), "--batch-size", "8", "--chunk-rows", "30", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run([sys.executable, "-m", "tests.ray.job_driver", "own-ray", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    cpus = os.cpu_count()
    assert report["ray_cpus"] == cpus

    refused = report["refused"]
    assert refused["code"] == 2 and refused["seconds"] < 10
    assert f"--replicas {cpus + 1} x --num-cpus-per-replica 1 asks for {cpus + 1} CPUs" \
        in refused["stderr"]
    assert f"the Ray cluster has {cpus} CPUs" in refused["stderr"]

    full = report["full"]
    assert full["code"] == 0, full["stderr"]
    assert f"{cpus} replicas on {cpus} CPUs" in full["stderr"]
    got = pq.read_table(out).to_pylist()
    by_id = {r["id"]: r for r in got}
    assert len(got) == 90 and set(by_id) == {f"d{i}" for i in range(90)}
    assert by_id["d7"]["error"] == "empty text" and by_id["d7"]["embedding"] is None
    good = [i for i in range(90) if i != 7]
    want = np.stack([o.embedding for o in Engine(str(tiny_embedder)).embed(
        [texts[i] for i in good])])
    np.testing.assert_allclose([by_id[f"d{i}"]["embedding"] for i in good], want, atol=1e-5)
    assert [json.loads(line)["id"] for line in
            (out / "_errors.jsonl").read_text().splitlines()] == ["d7"]

    stuck = report["stuck"]
    assert stuck["error"] is not None, "a job that cannot progress did not stop"
    assert "made no progress for 10 s" in stuck["error"]
    assert f"The cluster has {cpus} CPUs" in stuck["error"]
    assert "--stall-timeout" in stuck["error"]
    assert stuck["seconds"] < 120
