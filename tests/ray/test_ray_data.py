"""Ray Data on a two-node cluster: embed_dataset and `pooler batch --ray` give the offline
Engine's vectors (1e-5) for every row exactly once, also when an engine actor is killed mid-job."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.cloudpickle

from pooler.cli.main import main
from pooler.engine.llm import Engine
from pooler.ray.data import EngineBatchPredictor, embed_dataset
from tests.batch.conftest import corpus_texts

# The dying predictor below is defined here: ship it to the actors by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def engine(tiny_embedder):
    return Engine(str(tiny_embedder))


def test_embed_dataset_on_two_nodes_matches_engine(ray_cluster, tiny_embedder, engine):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    texts = corpus_texts(60, seed=11)
    rows = [{"id": i, "text": t} for i, t in enumerate(texts)]
    rows[5]["text"], rows[17]["text"] = "", None
    ds = ray.data.from_items(rows, override_num_blocks=6)
    out = embed_dataset(ds, model=str(tiny_embedder), replicas=2, num_cpus=1, batch_size=8)
    got = sorted(out.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(60))
    assert got[5]["error"] == "empty text" and got[17]["error"] == "null text"
    assert got[5]["embedding"] is None
    good = [i for i in range(60) if i not in (5, 17)]
    want = np.stack([o.embedding for o in engine.embed([texts[i] for i in good])])
    np.testing.assert_allclose(np.stack([got[i]["embedding"] for i in good]), want, atol=1e-5)
    assert all(got[i]["error"] is None for i in good)


def test_cli_ray_equals_local_batch(ray_cluster, tiny_embedder, tmp_path):
    texts = corpus_texts(80, seed=12)
    source = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc": [f"d{i}" for i in range(80)], "text": texts}), source,
                   row_group_size=20)
    common = ["batch", "--model", str(tiny_embedder), "--input", str(source), "--id-column",
              "doc", "--no-progress"]
    assert main(common + ["--output", str(tmp_path / "local")]) == 0
    assert main(common + ["--output", str(tmp_path / "ray"), "--ray", "--ray-address",
                          ray_cluster.address, "--replicas", "2", "--batch-size", "16"]) == 0
    local = pq.read_table(tmp_path / "local").to_pylist()
    remote = sorted(pq.read_table(tmp_path / "ray").to_pylist(), key=lambda r: int(r["id"][1:]))
    assert [r["id"] for r in remote] == [r["id"] for r in local]
    np.testing.assert_allclose([r["embedding"] for r in remote],
                               [r["embedding"] for r in local], atol=1e-5)
    assert all(r["error"] is None for r in remote)
    assert (tmp_path / "ray" / "_errors.jsonl").read_text() == ""


class DiesOnce(EngineBatchPredictor):
    """Killed (SIGKILL, no cleanup) in the middle of its third batch, once per job."""
    marker: str = ""

    def __init__(self, *args, marker: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.marker, self.calls = marker, 0

    def __call__(self, batch):
        self.calls += 1
        if self.calls == 3 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(batch)


def test_killed_actor_is_retried_and_rows_come_out_once(ray_cluster, tiny_embedder, engine,
                                                        tmp_path):
    texts = corpus_texts(120, seed=13)
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)],
                             override_num_blocks=12)
    marker = tmp_path / "killed-pid"

    class Dying(DiesOnce):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, marker=str(marker), **kwargs)

    out = embed_dataset(ds, model=str(tiny_embedder), replicas=2, num_cpus=1, batch_size=10,
                        predictor_class=Dying)
    got = out.take_all()
    assert marker.exists(), "no actor was killed"
    ids = sorted(r["id"] for r in got)
    assert ids == list(range(120))  # none lost, none twice
    by_id = {r["id"]: r["embedding"] for r in got}
    want = np.stack([o.embedding for o in engine.embed(texts)])
    np.testing.assert_allclose(np.stack([by_id[i] for i in range(120)]), want, atol=1e-5)


REPO = Path(__file__).resolve().parents[2]


def test_killed_driver_resumes_with_every_row_once(ray_cluster, tiny_embedder, engine,
                                                  tmp_path):
    """SIGKILL the driver of `pooler batch --ray` once some part files exist; the same command
    again keeps those files and writes each remaining row once."""
    import subprocess
    import time

    texts = corpus_texts(240, seed=14)
    source = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc": [f"d{i}" for i in range(240)], "text": texts}), source,
                   row_group_size=40)
    out = tmp_path / "out"
    args = ["--model", str(tiny_embedder), "--input", str(source), "--id-column", "doc",
            "--output", str(out), "--ray", "--ray-address", ray_cluster.address,
            "--replicas", "2", "--batch-size", "10", "--chunk-rows", "20", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    # The same job with each batch 0.3 s slower, so that it is killed midway.
    driver = subprocess.Popen([sys.executable, "-m", "tests.ray.job_driver", "slow", *args],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(list(out.glob("part-*.parquet"))) < 2:
        assert driver.poll() is None, driver.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no part file in 300 s"
        time.sleep(0.05)
    driver.kill()
    driver.wait()
    first = {p.name: p.read_bytes() for p in out.glob("part-*.parquet")}
    first_rows = sum(pq.ParquetFile(out / n).metadata.num_rows for n in first)
    assert 0 < first_rows < 240, first_rows

    assert main(["batch", *args]) == 0
    for name, data in first.items():  # the killed run's parts are kept as they were
        assert (out / name).read_bytes() == data
    got = pq.read_table(out).to_pylist()
    ids = sorted(int(r["id"][1:]) for r in got)
    assert ids == list(range(240))  # none lost, none twice
    by_id = {r["id"]: r["embedding"] for r in got}
    want = np.stack([o.embedding for o in engine.embed(texts)])
    np.testing.assert_allclose([by_id[f"d{i}"] for i in range(240)], want, atol=1e-5)
    # Other settings on the same output are refused (before Ray runs anything).
    assert main(["batch", *args, "--task", "token_embed"]) == 2
