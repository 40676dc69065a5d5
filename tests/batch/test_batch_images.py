"""`pooler batch --image-column` on one machine: image rows (file paths relative to the corpus or
absolute, Parquet bytes, data URLs, Hugging Face Image structs) give the offline Engine's
vectors; a bad image (missing file, not an image, truncated, null, a number) is its own row's
error and every other row is written; page models write multi-vectors (token_embed,
pool_factor) and a page the engine refuses fails alone."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from pooler.batch.columns import TaskOptions  # noqa: E402
from pooler.batch.job import BatchSpec, run_batch  # noqa: E402
from pooler.cli.main import main  # noqa: E402
from pooler.engine.llm import Engine  # noqa: E402
from tests.batch.conftest import write_jsonl  # noqa: E402
from tests.models.image_text_folders import save_tiny_clip  # noqa: E402


def read_errors(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def make_images(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """n PNG files of different sizes and modes (RGB, L, RGBA)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        h, w = 20 + 3 * i, 44 - 2 * i
        pixels = rng.integers(0, 256, (h, w, 3), np.uint8)
        image = Image.fromarray(pixels).convert(("RGB", "L", "RGBA")[i % 3])
        paths.append(folder / f"img-{i}.png")
        image.save(paths[-1])
    return paths


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip", seed=4)


@pytest.fixture(scope="module")
def clip_engine(clip):
    return Engine(str(clip))


def test_jsonl_image_paths_match_engine_and_bad_images_fail_alone(tmp_path, clip, clip_engine):
    paths = make_images(tmp_path / "corpus" / "images", 9)
    (tmp_path / "corpus" / "images" / "notes.png").write_text("not an image")
    (tmp_path / "corpus" / "images" / "cut.png").write_bytes(paths[0].read_bytes()[:60])
    data_url = "data:image/png;base64," + base64.b64encode(paths[8].read_bytes()).decode()
    good = [{"id": f"p{i}", "image": f"images/img-{i}.png"} for i in range(8)]  # relative
    good[3]["image"] = str(paths[3])                                              # absolute
    good.append({"id": "p8", "image": data_url})
    bad = {1: {"id": "missing", "image": "images/none.png"},
           4: {"id": "not-image", "image": "images/notes.png"},
           6: {"id": "truncated", "image": "images/cut.png"},
           9: {"id": "null", "image": None}, 11: {"id": "number", "image": 7},
           12: {"id": "no-field", "text": "a cat"}, 13: {"id": "url", "image": "https://x/y.png"}}
    rows = list(good)
    for position, record in sorted(bad.items()):
        rows.insert(position, record)
    source = write_jsonl(tmp_path / "corpus" / "pages.jsonl", rows)
    out = tmp_path / "out.parquet"
    assert main(["batch", "--model", str(clip), "--input", str(source), "--image-column",
                 "image", "--id-column", "id", "--output", str(out), "--chunk-rows", "5",
                 "--no-progress"]) == 0

    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [r["id"] for r in good]  # input order, once each
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)  # [9, 24]
    want = clip_engine.embed(paths)
    np.testing.assert_allclose(got, np.stack([o.embedding for o in want]), atol=1e-5)
    assert table.column("num_tokens").to_pylist() == [o.num_tokens for o in want]

    errors = {e["id"]: e for e in read_errors(out / "_errors.jsonl")}
    assert sorted(e["row"] for e in errors.values()) == sorted(bad)
    assert errors["missing"]["error"] == \
        f"image[1]: no image file at '{tmp_path / 'corpus' / 'images' / 'none.png'}'."
    assert errors["not-image"]["error"].startswith("image[4] is not an image")
    assert "truncated or corrupt" in errors["truncated"]["error"]
    assert errors["null"]["error"] == "null image"
    assert errors["number"]["error"] == "image is a int, not a file path or bytes"
    assert errors["no-field"]["error"] == "line 13: no 'image' field (--image-column)"
    assert "is a URL" in errors["url"]["error"]


def test_parquet_bytes_and_hf_structs_equal_the_files(tmp_path, clip, clip_engine):
    paths = make_images(tmp_path / "images", 6, seed=1)
    blobs = [p.read_bytes() for p in paths]
    blobs[2] = b"\x89PNG broken"
    pq.write_table(pa.table({"key": list(range(100, 106)), "png": blobs}),
                   tmp_path / "bytes.parquet", row_group_size=4)
    # Hugging Face datasets' Image feature: {"bytes": ..., "path": ...}, bytes win.
    structs = [{"bytes": None, "path": p.name} for p in paths]
    structs[1] = {"bytes": paths[1].read_bytes(), "path": "ignored.png"}
    pq.write_table(pa.table({"key": list(range(100, 106)), "image": structs}),
                   tmp_path / "hf.parquet")
    for name, column, extra in (("bytes.parquet", "png", []),
                                ("hf.parquet", "image", ["--image-root", str(paths[0].parent)])):
        out = tmp_path / f"{name}.out"
        assert main(["batch", "--model", str(clip), "--input", str(tmp_path / name),
                     "--image-column", column, "--id-column", "key", "--output", str(out),
                     "--no-progress", *extra]) == 0
        table = pq.read_table(out)
        ids = table.column("id").to_pylist()
        kept = [i for i in range(6) if name == "hf.parquet" or i != 2]
        assert ids == [100 + i for i in kept]
        want = np.stack([o.embedding for o in clip_engine.embed([paths[i] for i in kept])])
        np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), want,
                                   atol=1e-5)
    assert [(e["row"], e["id"]) for e in read_errors(tmp_path / "bytes.parquet.out" /
                                                     "_errors.jsonl")] == [(2, 102)]


def test_wrong_models_tasks_and_flags_are_refused(tmp_path, clip, tiny_embedder, capsys):
    make_images(tmp_path / "images", 1)
    source = write_jsonl(tmp_path / "c.jsonl", [{"image": "images/img-0.png"}])
    base = ["batch", "--input", str(source), "--image-column", "image", "--no-progress"]
    assert main([*base, "--model", str(tiny_embedder), "--output", str(tmp_path / "a")]) == 2
    assert "is a text-only model: --image-column needs an image-text model" in \
        capsys.readouterr().err
    assert main([*base, "--model", str(clip), "--task", "classify",
                 "--output", str(tmp_path / "b")]) == 2
    assert "--image-column runs --task embed" in capsys.readouterr().err
    assert main([*base, "--model", str(clip), "--task", "token_embed",
                 "--output", str(tmp_path / "c")]) == 2
    assert "run it with --task embed" in capsys.readouterr().err
    assert main([*base, "--model", str(clip), "--text-column", "text",
                 "--output", str(tmp_path / "d")]) == 2
    assert "pass --text-column or --image-column, not both" in capsys.readouterr().err
    for name in "abcd":
        assert not list((tmp_path / name).glob("part-*"))


def test_page_model_writes_multi_vectors_and_an_oversized_page_fails_alone(tmp_path):
    from tests.models.colmodernvbert_folders import page_image, save_tiny_colmodernvbert

    folder = save_tiny_colmodernvbert(tmp_path / "pages")
    # (height, width) -> tiles of the 96px page: 3 x 1 + global (357 tokens), 2 x 3 + global
    # (602 tokens: over the 400-token budget below, refused by the engine after decoding)
    sizes = [(100, 30), (60, 90), (90, 28), (100, 34)]
    paths = []
    for i, (h, w) in enumerate(sizes):
        paths.append(tmp_path / f"page-{i}.png")
        page_image(h, w, seed=i).save(paths[-1])
    source = write_jsonl(tmp_path / "pages.jsonl",
                         [{"doc": f"d{i}", "page": p.name} for i, p in enumerate(paths)])
    spec = BatchSpec(input=str(source), model=str(folder), id_column="doc", chunk_rows=8,
                     image_column="page", options=TaskOptions(task="token_embed",
                                                              pool_factor=2))

    def engine():
        return Engine(str(folder), max_model_len=400, max_num_batched_tokens=400)

    report = run_batch(spec, tmp_path / "out", engine, progress=False)
    assert (report.rows, report.errors) == (3, 1)
    table = pq.read_table(tmp_path / "out")
    assert table.column("id").to_pylist() == ["d0", "d2", "d3"]
    want = engine().token_embed([paths[i] for i in (0, 2, 3)], pool_factor=2)
    for row, expected in zip(table.column("embeddings").to_pylist(), want):
        got = np.array(row, dtype=np.float32)  # [~num_tokens / 2, 16]
        assert got.shape == expected.embeddings.shape and got.shape[0] < 357 // 2 + 2
        np.testing.assert_allclose(got, expected.embeddings, atol=1e-5)
    [error] = read_errors(tmp_path / "out" / "_errors.jsonl")
    assert error["id"] == "d1" and error["error"].startswith(
        "ValueError: page[1]: the page costs 602 tokens")

    with pytest.raises(ValueError, match="page retrieval model: each page is a multi-vector"):
        run_batch(BatchSpec(input=str(source), model=str(folder), image_column="page"),
                  tmp_path / "embed", engine, progress=False)


def test_a_manifest_without_the_new_keys_still_resumes(tmp_path, clip):
    make_images(tmp_path / "images", 4)
    source = write_jsonl(tmp_path / "c.jsonl",
                         [{"image": f"images/img-{i}.png"} for i in range(4)])
    out = tmp_path / "out"
    args = ["batch", "--model", str(clip), "--input", str(source), "--output", str(out),
            "--text-column", "image", "--no-progress", "--chunk-rows", "2"]
    assert main(args) == 0  # a text column of file names: texts to CLIP, as asked
    manifest = json.loads((out / "_pooler_batch.json").read_text())
    for key in ("image_column", "image_root"):
        del manifest[key]
    del manifest["options"]["pool_factor"]
    (out / "_pooler_batch.json").write_text(json.dumps(manifest))
    (out / "part-00001.parquet").unlink()
    assert main(args) == 0
    assert pq.read_table(out).num_rows == 4
