"""`pooler batch` on one machine: outputs equal the offline Engine's, bad rows go to the errors
file, every input row is written or rejected exactly once, and a job killed mid-way resumes to
the rows of an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pcsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pooler.batch.columns import quantize  # noqa: E402
from pooler.cli.main import main  # noqa: E402
from pooler.engine.llm import Engine  # noqa: E402
from tests.batch.conftest import corpus_texts, write_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def read_errors(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def engine(tiny_embedder):
    return Engine(str(tiny_embedder))


def test_jsonl_embed_matches_engine_and_reports_bad_rows(tmp_path, tiny_embedder, engine):
    texts = corpus_texts(23)
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    bad = {3: {"id": "bad-null", "text": None}, 7: {"id": "bad-empty", "text": "   "},
           11: {"id": "bad-number", "text": 42}, 15: {"id": "bad-missing", "body": "x"},
           19: "{not json"}
    rows = list(records)
    for position, record in sorted(bad.items()):
        rows.insert(position, record)
    source = write_jsonl(tmp_path / "corpus.jsonl", rows)
    out = tmp_path / "out.parquet"
    assert main(["batch", "--model", str(tiny_embedder), "--input", str(source),
                 "--id-column", "id", "--output", str(out), "--chunk-rows", "8",
                 "--no-progress"]) == 0

    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [r["id"] for r in records]   # order kept, once each
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type)
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)  # [23, 32]
    want = np.stack([o.embedding for o in engine.embed(texts)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert table.column("num_tokens").to_pylist() == [o.num_tokens for o in engine.embed(texts)]

    errors = read_errors(out / "_errors.jsonl")
    assert [e["row"] for e in errors] == sorted(bad)
    by_row = {e["row"]: e for e in errors}
    assert by_row[3]["error"] == "null text" and by_row[3]["id"] == "bad-null"
    assert by_row[7]["error"] == "empty text"
    assert by_row[11]["error"] == "text is a int, not a string"
    assert "no 'text' field" in by_row[15]["error"]
    assert "invalid JSON" in by_row[19]["error"]
    assert table.num_rows + len(errors) == len(rows)


def test_parquet_and_csv_inputs_give_the_same_table(tmp_path, tiny_embedder, engine):
    texts = corpus_texts(30, seed=1)
    ids = list(range(1000, 1030))
    pq.write_table(pa.table({"pid": ids, "passage": texts}), tmp_path / "c.parquet",
                   row_group_size=7)  # row groups that do not line up with chunks
    pcsv.write_csv(pa.table({"pid": ids, "passage": texts}), tmp_path / "c.csv")
    tables = []
    for name in ("c.parquet", "c.csv"):
        out = tmp_path / f"{name}.out"
        main(["batch", "--model", str(tiny_embedder), "--input", str(tmp_path / name),
              "--text-column", "passage", "--id-column", "pid", "--output", str(out),
              "--chunk-rows", "11", "--no-progress"])
        tables.append(pq.read_table(out))
        assert sorted(p.name for p in out.glob("part-*.parquet")) == \
            ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    for table in tables:
        assert table.column("id").to_pylist() == ids
        got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
        np.testing.assert_allclose(got, np.stack([o.embedding for o in engine.embed(texts)]),
                                   atol=1e-5)


@pytest.mark.parametrize("precision,arrow_type", [("float16", pa.float16()),
                                                  ("int8", pa.int8()), ("binary", pa.uint8())])
def test_precisions(tmp_path, tiny_embedder, engine, precision, arrow_type):
    texts = corpus_texts(9, seed=2)
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "out"
    main(["batch", "--model", str(tiny_embedder), "--input", str(source), "--output", str(out),
          "--precision", precision, "--no-progress"])
    table = pq.read_table(out)
    field = table.schema.field("embedding").type
    assert field.value_type == arrow_type
    assert table.column("id").to_pylist() == list(range(9))  # row numbers without --id-column
    want = np.stack([o.embedding for o in engine.embed(texts)])  # [9, 32] float32
    got = np.stack([np.asarray(v, dtype=arrow_type.to_pandas_dtype())
                    for v in table.column("embedding").to_pylist()])
    if precision == "binary":
        assert field.list_size == 32 // 8
        np.testing.assert_array_equal(np.unpackbits(got, axis=-1), (want > 0).astype(np.uint8))
    elif precision == "int8":
        np.testing.assert_array_equal(got, quantize(want, "int8"))
        np.testing.assert_allclose(got / 127.0, want, atol=0.5 / 127 + 1e-6)
    else:
        np.testing.assert_allclose(got.astype(np.float32), want, atol=1e-3)


def test_other_tasks_match_engine(tmp_path, tiny_task_model, tiny_embedder):
    texts = ["Maria lives in Paris", "the quick brown fox", "Tokyo and Berlin are cities"]
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])

    def run(task: str, model: Path) -> pa.Table:
        out = tmp_path / f"out-{task}"
        assert main(["batch", "--model", str(model), "--task", task, "--input", str(source),
                     "--output", str(out), "--no-progress"]) == 0
        return pq.read_table(out)

    mlm = Engine(str(tiny_task_model("mlm")))
    table = run("sparse", tiny_task_model("mlm"))
    for row, want in zip(table.to_pylist(), mlm.embed_sparse(texts)):
        assert row["indices"] == want.indices.tolist()
        np.testing.assert_allclose(row["values"], want.values, atol=1e-5)

    dense = Engine(str(tiny_embedder))
    table = run("token_embed", tiny_embedder)
    for row, want in zip(table.to_pylist(), dense.token_embed(texts)):
        np.testing.assert_allclose(np.array(row["embeddings"]), want.embeddings, atol=1e-5)

    seq = Engine(str(tiny_task_model("seq")))
    table = run("classify", tiny_task_model("seq"))
    for row, want in zip(table.to_pylist(), seq.classify(texts)):
        assert row["label"] == want.label
        np.testing.assert_allclose(row["probs"], want.probs, atol=1e-5)

    tagger = Engine(str(tiny_task_model("token")))
    table = run("ner", tiny_task_model("token"))
    for row, want in zip(table.to_pylist(), tagger.ner(texts)):
        assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in row["entities"]] \
            == [(e.entity_group, e.word, e.start, e.end) for e in want]
        np.testing.assert_allclose([e["score"] for e in row["entities"]],
                                   [e.score for e in want], atol=1e-5)


def test_rerun_with_other_settings_is_refused(tmp_path, tiny_embedder, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in corpus_texts(5)])
    out = tmp_path / "out"
    args = ["batch", "--model", str(tiny_embedder), "--input", str(source), "--output",
            str(out), "--no-progress"]
    assert main(args) == 0
    assert main(args + ["--chunk-rows", "2"]) == 2
    assert "changed: chunk_rows" in capsys.readouterr().err
    assert main(args + ["--chunk-rows", "2", "--overwrite"]) == 0
    assert len(list(out.glob("part-*.parquet"))) == 3


def test_wrong_task_fails_before_writing(tmp_path, tiny_embedder, capsys):
    source = write_jsonl(tmp_path / "c.jsonl", [{"text": "a text"}])
    out = tmp_path / "out"
    assert main(["batch", "--model", str(tiny_embedder), "--task", "classify", "--input",
                 str(source), "--output", str(out), "--no-progress"]) == 2
    assert "cannot run task 'classify'" in capsys.readouterr().err
    assert not list(out.glob("part-*"))


def test_killed_job_resumes_to_the_uninterrupted_result(tmp_path, tiny_embedder):
    n, chunk = 2000, 100
    texts = corpus_texts(n, seed=4)
    records = [{"id": i, "text": t} for i, t in enumerate(texts)]
    records[1234]["text"] = ""  # one rejected row, in a chunk that the killed run may redo
    source = write_jsonl(tmp_path / "c.jsonl", records)

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "pooler.cli.main", "batch", "--model", str(tiny_embedder),
                "--input", str(source), "--id-column", "id", "--output", str(out),
                "--chunk-rows", str(chunk), "--threads", "1", "--no-progress"]

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = tmp_path / "killed.parquet"
    proc = subprocess.Popen(command(killed), env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(list(killed.glob("part-*.parquet"))) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no part files after 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    parts_at_kill = len(list(killed.glob("part-*.parquet")))
    assert parts_at_kill < n // chunk, "the job finished before it was killed"

    resumed = subprocess.run(command(killed), env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{parts_at_kill} resumed" in resumed.stderr
    whole = tmp_path / "whole.parquet"  # the same command, uninterrupted (in this process)
    assert main(command(whole)[3:]) == 0

    got, want = pq.read_table(killed), pq.read_table(whole)
    ids = got.column("id").to_pylist()
    assert ids == [i for i in range(n) if i != 1234]  # none lost, none twice, in order
    assert got.equals(want)
    assert read_errors(killed / "_errors.jsonl") == [
        {"row": 1234, "id": 1234, "error": "empty text"}]
