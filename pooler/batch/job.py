"""A resumable corpus job on one machine: chunks in, one Parquet part file per chunk out.

Output layout (a directory, as Spark and Ray Data write one; pyarrow, pandas, DuckDB and
Polars read it as one table):

    out.parquet/
      _pooler_batch.json       what the job is (input, model, task, chunk size): a re-run must match
      part-00000.parquet       rows [0, chunk_rows) that were valid, with id + outputs
      part-00001.parquet       ...
      _errors/part-00000.jsonl rows of chunk 0 that were rejected: {"row", "id", "error"}
      _errors.jsonl            all rejected rows, written when the job completes

Exactly-once: a part file appears by an atomic rename after its errors file, so a part file
that exists is complete. A re-run of the same command skips chunks whose part exists and
recomputes the others; chunk k always holds the same input rows (pooler/batch/reader.py), so
the result equals an uninterrupted run's. Files starting with `_` or `.` are ignored by Parquet
dataset readers.

Rows are texts (`text_column`) or images (`image_column`: paths, bytes, data URLs; see
pooler/batch/images.py); a bad image is its row's error, like a bad text.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from pooler.batch.columns import TaskOptions, compute_columns
from pooler.batch.images import (check_image_model, check_image_task, compute_image_rows,
                                 default_image_root, image_item)
from pooler.batch.reader import Chunk, count_rows, input_format, read_chunks

MANIFEST = "_pooler_batch.json"
ERRORS_DIR = "_errors"
ERRORS_FILE = "_errors.jsonl"


@dataclass
class BatchSpec:
    """Everything that decides what each part file holds. A resumed run must have the same."""
    input: str
    model: str
    text_column: str = "text"
    id_column: str | None = None
    chunk_rows: int = 4096
    input_format: str | None = None
    options: TaskOptions = field(default_factory=TaskOptions)
    image_column: str | None = None   # rows are images (pooler/batch/images.py), not texts
    image_root: str | None = None     # relative image paths' folder (default: the input's)

    def __post_init__(self):
        self.input = str(Path(self.input).resolve())
        self.input_format = input_format(self.input, self.input_format)
        if self.chunk_rows <= 0:
            raise ValueError(f"--chunk-rows must be positive, got {self.chunk_rows}.")
        if self.image_column is not None:
            check_image_task(self.options.task)
            self.image_root = str(Path(self.image_root).resolve()) if self.image_root \
                else default_image_root(self.input)
        elif self.image_root is not None:
            raise ValueError("--image-root applies to an --image-column; this job has none.")

    @property
    def column(self) -> str:
        """The input column: the images' or the texts'."""
        return self.image_column or self.text_column

    @property
    def column_option(self) -> str:
        return "--image-column" if self.image_column else "--text-column"

    def manifest(self) -> dict:
        stat = Path(self.input).stat()
        return {"format_version": 1, **asdict(self), "input_bytes": stat.st_size,
                "input_mtime_ns": stat.st_mtime_ns}


@dataclass
class BatchReport:
    rows: int = 0            # rows written to part files by the whole job
    errors: int = 0          # rows rejected by the whole job
    parts: int = 0
    resumed_parts: int = 0   # parts found complete and skipped
    seconds: float = 0.0     # wall time of this run
    output: str = ""
    errors_file: str = ""


def row_problem(text, id_value, has_id_column: bool, problem: str | None) -> str | None:
    """Why a row cannot be embedded, or None."""
    if problem:
        return problem
    if has_id_column and id_value is None:
        return "null id"
    if text is None:
        return "null text"
    if not isinstance(text, str):
        return f"text is a {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text"
    return None


def run_batch(spec: BatchSpec, output: str | Path, make_engine: Callable[[], object], *,
              errors_file: str | Path | None = None, progress: bool = True,
              overwrite: bool = False) -> BatchReport:
    """Run (or resume) the job; returns what the whole job produced."""
    started = time.perf_counter()
    out = Path(output)
    _prepare_output(out, spec, overwrite)
    (out / ERRORS_DIR).mkdir(exist_ok=True)
    id_type = _id_type(spec)
    total = count_rows(spec.input, spec.input_format, spec.column, spec.column_option)
    engine = None
    report = BatchReport(output=str(out))
    done = sum(min(spec.chunk_rows, total - k * spec.chunk_rows)
               for k in _part_numbers(out) if k * spec.chunk_rows < total)
    # `initial`: rows/s and the ETA count this run's rows only.
    with tqdm(total=total, initial=done, unit="row", desc=f"pooler batch {spec.options.task}",
              disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
        for chunk in read_chunks(spec.input, spec.input_format, spec.column,
                                 spec.id_column, spec.chunk_rows, spec.column_option):
            part = out / f"part-{chunk.index:05d}.parquet"
            report.parts += 1
            if part.exists():
                report.resumed_parts += 1
                continue
            if engine is None:
                engine = make_engine()
                _probe(engine, spec)
            table, errors = process_chunk(engine, chunk, spec, id_type)
            _write_atomically(out / ERRORS_DIR / f"part-{chunk.index:05d}.jsonl",
                              lambda p: _write_errors(p, errors))
            _write_atomically(part, lambda p: pq.write_table(table, p))
            bar.update(len(chunk))
    report.rows, report.errors = _totals(out, report.parts)
    report.errors_file = str(_merge_errors(out, report.parts, errors_file))
    report.seconds = time.perf_counter() - started
    return report


def process_chunk(engine, chunk: Chunk, spec: BatchSpec,
                  id_type: pa.DataType) -> tuple[pa.Table, list[dict]]:
    """The chunk's valid rows as a table (id + outputs, in input order) and its rejected rows."""
    errors: list[dict] = []
    good: list[int] = []
    items: list = []  # the image items of the good rows (an image column)
    for i, (cell, id_value, problem) in enumerate(zip(chunk.texts, chunk.ids, chunk.problems)):
        if spec.image_column is None:
            why = row_problem(cell, id_value, spec.id_column is not None, problem)
        else:
            why = problem or _null_id(id_value, spec.id_column is not None)
            if why is None:
                item, why = image_item(cell, spec.image_root)
        if why is None and not _fits(id_value, id_type):
            why = f"id {id_value!r} is not of the id column's type {id_type}"
        if why is None:
            good.append(i)
            if spec.image_column is not None:
                items.append(item)
        else:
            errors.append({"row": chunk.first_row + i, "id": _jsonable(id_value), "error": why})
    if spec.image_column is not None:
        columns, good = _image_rows(engine, chunk, good, items, spec, errors)
    else:
        texts = [chunk.texts[i] for i in good]
        try:
            columns = compute_columns(engine, texts, spec.options) if texts else None
        except Exception:  # noqa: BLE001 - find the rows that fail, keep the others
            columns, good = _one_by_one(engine, chunk, good, spec.options, errors)
    errors.sort(key=lambda e: e["row"])
    if columns is None:
        return _empty_table(engine, spec, id_type), errors
    ids = pa.array([chunk.ids[i] for i in good], type=id_type)
    return pa.table({"id": ids, **columns}), errors


def _null_id(id_value, has_id_column: bool) -> str | None:
    return "null id" if has_id_column and id_value is None else None


def _image_rows(engine, chunk: Chunk, good: list[int], items: list, spec: BatchSpec,
                errors: list[dict]):
    """The image rows' columns and the rows they hold; a bad image is its row's error."""
    rows = [chunk.first_row + i for i in good]
    columns, kept, failed = compute_image_rows(engine, items, rows, spec.options,
                                               spec.image_column)
    for at, why in failed.items():
        errors.append({"row": rows[at], "id": _jsonable(chunk.ids[good[at]]), "error": why})
    return columns, [good[at] for at in kept]


def _one_by_one(engine, chunk: Chunk, good: list[int], opts: TaskOptions, errors: list[dict]):
    """After a failed chunk: run rows alone, so one row the engine rejects fails alone."""
    kept, parts = [], []
    for i in good:
        try:
            parts.append(compute_columns(engine, [chunk.texts[i]], opts))
            kept.append(i)
        except Exception as exc:  # noqa: BLE001 - reported in the errors file
            errors.append({"row": chunk.first_row + i, "id": _jsonable(chunk.ids[i]),
                           "error": f"{type(exc).__name__}: {exc}"})
    if not parts:
        return None, []
    return {name: pa.concat_arrays([p[name] for p in parts]) for name in parts[0]}, kept


def _empty_table(engine, spec: BatchSpec, id_type: pa.DataType) -> pa.Table:
    """A zero-row part with the job's schema (a chunk whose rows were all rejected)."""
    columns = compute_columns(engine, ["schema probe"], spec.options)
    return pa.table({"id": pa.array([], type=id_type),
                     **{k: v.slice(0, 0) for k, v in columns.items()}})


def _probe(engine, spec: BatchSpec) -> None:
    """Fail before writing anything when the model cannot run the task at all (wrong --task,
    --dimensions too large, a prompt name the model lacks, images for a text model). An
    image job probes with a text too: the model's texts and images share the output's type
    and width, and a probe image could cost a page model more than its token budget."""
    opts = spec.options
    try:
        if spec.image_column is not None:
            check_image_model(engine, opts.task)
        compute_columns(engine, ["probe"], opts)
    except (ValueError, RuntimeError) as exc:
        raise ValueError(f"the model cannot run task {opts.task!r} with these options: "
                         f"{exc}") from exc


def refuse_changed_settings(output: str, manifest: dict, previous: dict) -> None:
    """A job resumes only under the settings it started with (the local and the Ray job):
    a ValueError naming every manifest key that changed."""
    changed = sorted(k for k in set(manifest) | set(previous)
                     if not _same(manifest.get(k), previous.get(k)))
    if changed:
        raise ValueError(f"--output {output} holds a job with other settings (changed: "
                         f"{', '.join(changed)}); re-run the same command to resume, or pass "
                         "--overwrite to start again.")


def _same(value, previous) -> bool:
    """Equal settings; a key a manifest lacks reads as None (a manifest written before an
    option existed, e.g. options.pool_factor, resumes under its default)."""
    if isinstance(value, dict) and isinstance(previous, dict):
        return all(_same(value.get(k), previous.get(k)) for k in set(value) | set(previous))
    return value == previous


def _prepare_output(out: Path, spec: BatchSpec, overwrite: bool) -> None:
    manifest = spec.manifest()
    path = out / MANIFEST
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out} is a file; the output is a directory of part files.")
    if out.is_dir() and any(out.iterdir()):
        if overwrite:
            _clear(out)
        elif not path.is_file():
            raise ValueError(f"--output {out} exists and is not a pooler batch output; pick a "
                             "new path or pass --overwrite.")
        else:
            refuse_changed_settings(str(out), manifest, json.loads(path.read_text()))
            return
    out.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, lambda p: p.write_text(json.dumps(manifest, indent=1)))


def _part_numbers(out: Path) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in out.glob("part-*.parquet")]


def _clear(out: Path) -> None:
    for p in sorted(out.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()


def _id_type(spec: BatchSpec) -> pa.DataType:
    """The id column's type: from the first chunk's ids (row numbers: int64)."""
    if spec.id_column is None:
        return pa.int64()
    first = next(read_chunks(spec.input, spec.input_format, spec.column, spec.id_column,
                             spec.chunk_rows, spec.column_option), None)
    values = [v for v in (first.ids if first else []) if v is not None]
    try:
        kind = pa.array(values).type if values else pa.string()
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: keep them as strings
        kind = pa.string()
    if pa.types.is_null(kind):
        return pa.string()
    return pa.string() if pa.types.is_large_string(kind) else kind


def _fits(value, id_type: pa.DataType) -> bool:
    if value is None:
        return True
    try:
        pa.scalar(value, type=id_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False
    return not (isinstance(value, bool) and not pa.types.is_boolean(id_type))


def _jsonable(value):
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_errors(path: Path, errors: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in errors:
            f.write(json.dumps(e) + "\n")


def _totals(out: Path, parts: int) -> tuple[int, int]:
    rows = sum(pq.ParquetFile(out / f"part-{k:05d}.parquet").metadata.num_rows
               for k in range(parts))
    errors = 0
    for k in range(parts):
        with open(out / ERRORS_DIR / f"part-{k:05d}.jsonl", "rb") as f:
            errors += sum(1 for _ in f)
    return rows, errors


def _merge_errors(out: Path, parts: int, errors_file: str | Path | None) -> Path:
    target = Path(errors_file) if errors_file else out / ERRORS_FILE

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            for k in range(parts):
                f.write((out / ERRORS_DIR / f"part-{k:05d}.jsonl").read_bytes())

    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(target, write)
    return target
