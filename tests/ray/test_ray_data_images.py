"""Image columns on Ray Data (two-node cluster): `pooler batch --ray --image-column` with paths
relative to the corpus gives the local job's vectors, and each bad image is its own row's error;
embed_dataset takes encoded bytes."""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray

from pooler.cli.main import main
from pooler.engine.llm import Engine
from pooler.ray.data import embed_dataset
from tests.batch.conftest import write_jsonl
from tests.batch.test_batch_images import make_images
from tests.models.image_text_folders import save_tiny_clip


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip", seed=5)


def test_cli_ray_image_paths_equal_local_batch(ray_cluster, clip, tiny_embedder, tmp_path,
                                               capsys):
    paths = make_images(tmp_path / "corpus" / "images", 12, seed=2)
    (tmp_path / "corpus" / "images" / "notes.png").write_text("not an image")
    rows = [{"doc": f"d{i}", "image": f"images/{p.name}"} for i, p in enumerate(paths)]
    rows[3]["image"] = "images/missing.png"
    rows[7]["image"] = "images/notes.png"
    rows[9]["image"] = None
    source = write_jsonl(tmp_path / "corpus" / "pages.jsonl", rows)
    common = ["batch", "--model", str(clip), "--input", str(source), "--image-column", "image",
              "--id-column", "doc", "--no-progress"]
    assert main(common + ["--output", str(tmp_path / "local")]) == 0
    assert main(common + ["--output", str(tmp_path / "ray"), "--ray", "--ray-address",
                          ray_cluster.address, "--batch-size", "4"]) == 0
    local = {r["id"]: r for r in pq.read_table(tmp_path / "local").to_pylist()}
    remote = {r["id"]: r for r in pq.read_table(tmp_path / "ray").to_pylist()}
    assert set(remote) == {r["doc"] for r in rows} and "image" not in \
        pq.read_schema(next((tmp_path / "ray").glob("part-*.parquet"))).names
    bad = {"d3", "d7", "d9"}
    assert set(local) == set(remote) - bad
    for doc in local:
        np.testing.assert_allclose(remote[doc]["embedding"], local[doc]["embedding"], atol=1e-5)
        assert remote[doc]["error"] is None
    assert remote["d3"]["error"] == \
        f"image[d3]: no image file at '{tmp_path / 'corpus' / 'images' / 'missing.png'}'."
    assert remote["d7"]["error"].startswith("image[d7] is not an image")
    assert remote["d9"]["error"] == "null image" and remote["d9"]["embedding"] is None
    listed = [json.loads(line) for line in (tmp_path / "ray" / "_errors.jsonl").read_text()
              .splitlines()]
    assert sorted(e["id"] for e in listed) == sorted(bad)

    # a text model is refused on the driver, before any actor starts or anything is written
    text_model = [*common[:2], str(tiny_embedder), *common[3:]]
    assert main(text_model + ["--output", str(tmp_path / "text"), "--ray", "--ray-address",
                              ray_cluster.address]) == 2
    assert "BertModel is a text-only model: --image-column needs" in capsys.readouterr().err
    assert not (tmp_path / "text").exists()


def test_embed_dataset_takes_image_bytes(ray_cluster, clip, tmp_path):
    paths = make_images(tmp_path / "images", 6, seed=3)
    rows = [{"id": i, "png": p.read_bytes()} for i, p in enumerate(paths)]
    rows[4]["png"] = b"not an image at all"
    ds = ray.data.from_items(rows, override_num_blocks=2)
    got = sorted(embed_dataset(ds, model=str(clip), image_column="png", id_column="id",
                               replicas=1, num_cpus=1, batch_size=3).take_all(),
                 key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(6))
    assert got[4]["error"].startswith("png[4] is not an image") and got[4]["embedding"] is None
    good = [0, 1, 2, 3, 5]
    want = np.stack([o.embedding for o in Engine(str(clip)).embed([paths[i] for i in good])])
    np.testing.assert_allclose(np.stack([got[i]["embedding"] for i in good]), want, atol=1e-5)
