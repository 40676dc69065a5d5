"""`pooler batch --ray`: the corpus job on Ray Data, resumable, and never silent when stuck.

    read (Ray Data's readers, S3/GCS too) -> prepare (id column to `id`, drop the rows a
    previous run already wrote, cut blocks of --batch-size rows) -> map_batches over --replicas
    engine actors (pooler/ray/data.py) -> the driver writes part files

Output (a directory, like the local job's; pyarrow, pandas, DuckDB, Polars read it as a table):

    out.parquet/
      _pooler_batch.json    the job (input, model, columns, task options): a re-run must match
      part-00000.parquet    id, the task's columns and `error` (null where the row ran)
      ...
      _errors.jsonl         the rejected rows {"id", "error"}, listed when the job ends

Resume: the driver writes each part file under a temporary name and renames it, so a part file
that exists is complete. Re-running the same command reads the ids in the existing parts and
drops those rows before the actors: a row is in exactly one part file whatever was killed
(driver, actor or node), as long as --id-column is unique. Rows of a killed run that were
computed but not yet in a part are computed again.

Never hangs: the actors are sized to the cluster before anything runs (pooler/ray/resources.py:
refused at once when they cannot fit, reservations scaled down when they would starve the read
tasks), and Ray Data's no-progress guard stops the job with JobStalled when no block is read,
computed or handed to the driver for `stall_timeout` seconds.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pooler.batch.columns import TaskOptions
from pooler.batch.images import check_image_config, check_image_task, default_image_root
from pooler.batch.job import refuse_changed_settings
from pooler.ray.data import EngineBatchPredictor, embed_dataset, read_corpus
from pooler.ray.resources import TASK_CPUS, TASK_ROOM, cluster_nodes, plan_actors

MANIFEST = "_pooler_batch.json"
ERRORS_FILE = "_errors.jsonl"
DEFAULT_STALL_TIMEOUT_S = 600.0


class JobStalled(RuntimeError):
    """The job made no progress for its stall timeout and was stopped."""


def run_ray_batch(*, input: str, output: str, engine_kwargs: dict, options: TaskOptions,
                  text_column: str = "text", id_column: str | None = None,
                  image_column: str | None = None, image_root: str | None = None,
                  input_format: str | None = None, errors: str | None = None,
                  replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  batch_size: int = 1024, chunk_rows: int = 4096, address: str | None = None,
                  overwrite: bool = False, stall_timeout: float = DEFAULT_STALL_TIMEOUT_S,
                  progress: bool = False,
                  predictor_class: type = EngineBatchPredictor) -> dict:
    """Run (or resume) the job; returns what the whole job produced.

    address: the cluster to join; None starts a local Ray with this machine's CPUs (or uses
    the one this process is already connected to). On a multi-node cluster, input and output
    must be on storage every node sees (with image_column, the image files too).

    image_column: the rows are images (pooler/batch/images.py), not `text_column`'s texts;
    relative paths are read under image_root (default: the input's folder)."""
    import ray

    if id_column is None:
        raise ValueError("--ray needs --id-column: Ray Data reads files in parallel and does "
                         "not number rows; the id is also what a resumed run skips by.")
    if batch_size <= 0 or chunk_rows <= 0:
        raise ValueError(f"--batch-size and --chunk-rows must be positive, got {batch_size} "
                         f"and {chunk_rows}.")
    if stall_timeout <= 0:
        raise ValueError(f"--stall-timeout must be positive seconds, got {stall_timeout:g}.")
    if image_column is not None:
        check_image_task(options.task)
        _check_image_model(engine_kwargs, options.task)
        image_root = str(Path(image_root).resolve()) if image_root \
            else default_image_root(input)
    elif image_root is not None:
        raise ValueError("--image-root applies to an --image-column; this job has none.")
    column = image_column or text_column
    started = time.perf_counter()
    out = _Output(output)
    manifest = _manifest(input, input_format, engine_kwargs["model"], text_column, id_column,
                         options, image_column, image_root)
    out.prepare(manifest, overwrite)
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address=address or "local", log_to_driver=False, include_dashboard=False)
    try:
        plan = plan_actors(*cluster_nodes(), replicas=replicas, num_cpus=num_cpus,
                           num_gpus=num_gpus, task_room=TASK_ROOM, task_cpus=TASK_CPUS)
        done = out.done_ids()
        ds = read_corpus(input, input_format, [id_column, column], plan.task_cpus)
        task_args = {} if plan.task_cpus is None else {"num_cpus": plan.task_cpus}
        ds = ds.map_batches(
            _prepare, batch_format="pyarrow", batch_size=None,
            fn_kwargs={"id_column": id_column, "column": column,
                       "option": "--image-column" if image_column else "--text-column",
                       "done": [ray.put(done)] if len(done) else []}, **task_args)
        # Blocks of one batch each, so that every actor gets work even from a one-block input.
        ds = _repartition(ds, batch_size, plan.task_cpus)
        model = engine_kwargs["model"]
        rest = {k: v for k, v in engine_kwargs.items() if k != "model" and v is not None}
        result = embed_dataset(ds, model=model, text_column=text_column, replicas=replicas,
                               num_cpus=num_cpus, num_gpus=num_gpus, batch_size=batch_size,
                               engine_kwargs=rest, predictor_class=predictor_class, plan=plan,
                               repartition=False, id_column="id", image_column=image_column,
                               image_root=image_root, **options.to_dict())
        result.context.execution_no_progress_timeout_s = stall_timeout
        result.context.enable_progress_bars = progress
        written = _write_parts(result, out, column, chunk_rows, plan, replicas, num_cpus,
                               batch_size, stall_timeout)
    finally:
        if own_ray:
            ray.shutdown()
    rows, rejected, errors_path = out.finish(errors)
    return {"rows": rows - rejected, "errors": rejected, "errors_file": errors_path,
            "resumed_rows": len(done), "written_rows": written, "parts": out.part_count(),
            "cluster_cpus": plan.cluster_cpus, "plan": plan.describe(),
            "seconds": time.perf_counter() - started}


def _check_image_model(engine_kwargs: dict, task: str) -> None:
    """Refuse a model that cannot run an image column here, from its config: in the actors
    it would only show as an actor that fails to start. A config the driver cannot read (a
    path only the workers see) is left to the actors."""
    from pooler.config import ModelConfig

    try:
        config = ModelConfig(model=engine_kwargs["model"], task=engine_kwargs.get("task"),
                             runner=engine_kwargs.get("runner") or "auto",
                             revision=engine_kwargs.get("revision"),
                             hf_overrides=engine_kwargs.get("hf_overrides"))
    except Exception:  # noqa: BLE001 - the actors load it and say why
        return
    check_image_config(config, task)


def _repartition(ds, rows: int, task_cpus: float | None):
    """`ds.repartition(target_num_rows_per_block=rows)` whose tasks ask `task_cpus`.

    Ray Data 2.60's repartition takes no resource argument and its tasks ask a whole CPU,
    which a cluster full of engine actors does not have; its logical operator carries the
    remote args, so set them there (ray is pinned to 2.60 in pyproject.toml; the single-node
    test in tests/ray runs this path). With equal args, Ray fuses it into the prepare step."""
    ds = ds.repartition(target_num_rows_per_block=rows)
    if task_cpus is not None:
        op = ds._logical_plan.dag
        if type(op).__name__ != "StreamingRepartition" or \
                not isinstance(getattr(op, "ray_remote_args", None), dict):
            raise RuntimeError(f"this Ray Data ({type(op).__name__}) does not let pooler size "
                               "its repartition tasks; use ray 2.60 (pip install "
                               "'pooler[ray]').")
        op.ray_remote_args["num_cpus"] = task_cpus
    return ds


def _prepare(batch: pa.Table, id_column: str, column: str, option: str,
             done: list) -> pa.Table:
    """The id column (as `id`) and the input column (texts or images, named by `option`);
    without the rows whose id a previous run wrote."""
    for flag, name in (("--id-column", id_column), (option, column)):
        if name not in batch.column_names:
            raise ValueError(f"the input has no column {name!r} ({flag}); its columns are "
                             f"{batch.column_names}.")
    batch = pa.table({"id": batch.column(id_column), column: batch.column(column)})
    if done:
        import ray

        seen = ray.get(done[0])
        ids = batch.column("id")
        if seen.type != ids.type:
            seen = seen.cast(ids.type)
        batch = batch.filter(pc.invert(pc.is_in(ids, value_set=seen)))
    return batch


def _write_parts(result, out: "_Output", column: str, chunk_rows: int, plan, replicas,
                 num_cpus, batch_size, stall_timeout) -> int:
    """Stream the job's output into part files of about `chunk_rows` rows (without the input
    column: texts or image bytes); rows written."""
    from ray.data.exceptions import ExecutionTimeoutError

    pending: list[pa.Table] = []
    held = written = 0
    try:
        for batch in result.iter_batches(batch_size=None, batch_format="pyarrow"):
            if batch.num_rows == 0:
                continue
            pending.append(batch.drop_columns([column]))
            held += batch.num_rows
            if held >= chunk_rows:
                out.write_part(pa.concat_tables(pending))
                written += held
                pending, held = [], 0
    except ExecutionTimeoutError as exc:
        report = str(exc).split("If this is expected")[0].strip()
        raise JobStalled(
            f"the Ray job made no progress for {stall_timeout:g} s (no block read, computed "
            f"or handed over) and was stopped. The cluster has {plan.cluster_cpus:g} CPUs; "
            f"the job asked for {replicas} engine actor(s) of {num_cpus:g} CPU(s) "
            f"({plan.describe()}). Rows already in part files are kept: re-run the same "
            f"command to resume. If one batch of --batch-size {batch_size} rows (or loading "
            f"the model) legitimately takes longer, lower --batch-size or raise "
            f"--stall-timeout. Ray Data said: {report}") from None
    if pending:
        out.write_part(pa.concat_tables(pending))
        written += held
    return written


def _manifest(input: str, fmt: str | None, model: str, text_column: str, id_column: str,
              options: TaskOptions, image_column: str | None, image_root: str | None) -> dict:
    manifest = {"format_version": 1, "runner": "ray", "input": input, "input_format": fmt,
                "model": model, "text_column": text_column, "id_column": id_column,
                "options": options.to_dict(), "image_column": image_column,
                "image_root": image_root}
    if "://" not in input and Path(input).exists():
        path = Path(input).resolve()
        stat = path.stat()
        manifest.update(input=str(path), input_bytes=stat.st_size,
                        input_mtime_ns=stat.st_mtime_ns)
    return manifest


class _Output:
    """The output directory on a local disk or an object store (pyarrow.fs), written only by
    the driver."""

    def __init__(self, output: str):
        if "://" in output:
            self.fs, self.root = pafs.FileSystem.from_uri(output)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), str(Path(output).resolve())
        self.display = output
        self.next_part = 0

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _names(self) -> list[str]:
        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.NotFound:
            return []
        if info.type != pafs.FileType.Directory:
            raise ValueError(f"--output {self.display} is a file; the output is a directory of "
                             "part files.")
        selector = pafs.FileSelector(self.root, recursive=False)
        return sorted(i.base_name for i in self.fs.get_file_info(selector))

    def parts(self) -> list[str]:
        return [n for n in self._names() if n.startswith("part-") and n.endswith(".parquet")]

    def part_count(self) -> int:
        return len(self.parts())

    def prepare(self, manifest: dict, overwrite: bool) -> None:
        names = self._names()
        if names and overwrite:
            self.fs.delete_dir_contents(self.root)
        elif names:
            if MANIFEST not in names:
                raise ValueError(f"--output {self.display} exists and is not a pooler batch "
                                 "--ray output; pick a new path or pass --overwrite.")
            with self.fs.open_input_stream(self._path(MANIFEST)) as f:
                refuse_changed_settings(self.display, manifest, json.loads(f.read()))
            for name in names:  # a killed run's half-written files
                if name.startswith(".") and name.endswith(".tmp"):
                    self.fs.delete_file(self._path(name))
            self.next_part = max((int(n[5:-8]) for n in self.parts()), default=-1) + 1
            return
        self.fs.create_dir(self.root, recursive=True)
        self._write_atomically(MANIFEST, lambda path: self._write_text(
            path, json.dumps(manifest, indent=1)))

    def done_ids(self) -> pa.Array:
        """The ids of every row in a complete part file (an empty array when none)."""
        parts = [self._path(n) for n in self.parts()]
        if not parts:
            return pa.array([])
        ids = [pq.read_table(p, columns=["id"], filesystem=self.fs).column("id")
               for p in parts]
        return pa.chunked_array(ids).combine_chunks() if len(ids) > 1 else \
            ids[0].combine_chunks()

    def write_part(self, table: pa.Table) -> None:
        name = f"part-{self.next_part:05d}.parquet"
        self._write_atomically(name, lambda path: pq.write_table(table, path,
                                                                 filesystem=self.fs))
        self.next_part += 1

    def finish(self, errors: str | None) -> tuple[int, int, str]:
        """(rows, rejected rows, errors file): the errors file from the part files (a
        streaming scan of two columns)."""
        rows, rejected = 0, 0
        lines: list[str] = []
        for name in self.parts():
            file = pq.ParquetFile(self._path(name), filesystem=self.fs)
            rows += file.metadata.num_rows
            for batch in file.iter_batches(columns=["id", "error"]):
                for row in batch.filter(pc.is_valid(batch.column("error"))).to_pylist():
                    rejected += 1
                    lines.append(json.dumps({"id": row["id"], "error": row["error"]},
                                            default=str) + "\n")
        if errors:
            Path(errors).parent.mkdir(parents=True, exist_ok=True)
            Path(errors).write_text("".join(lines), encoding="utf-8")
            return rows, rejected, errors
        self._write_atomically(ERRORS_FILE, lambda path: self._write_text(path, "".join(lines)))
        return rows, rejected, self._path(ERRORS_FILE)

    def _write_text(self, path: str, text: str) -> None:
        with self.fs.open_output_stream(path) as f:
            f.write(text.encode("utf-8"))

    def _write_atomically(self, name: str, write) -> None:
        tmp = self._path(f".{name}.tmp")
        write(tmp)
        self.fs.move(tmp, self._path(name))
