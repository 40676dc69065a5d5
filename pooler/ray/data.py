"""Corpus jobs on Ray Data: one Engine per actor, an actor pool of N, Parquet out.

    import ray
    from pooler.ray import embed_dataset

    ds = ray.data.read_parquet("s3://bucket/corpus/")
    out = embed_dataset(ds, model="sentence-transformers/all-MiniLM-L6-v2", task="embed",
                        replicas=4, num_gpus=1)
    out.write_parquet("s3://bucket/embeddings/")

Each actor builds one `Engine` (continuous batching inside it) and gets `batch_size` rows per
call. The output keeps the input's columns and adds the task's columns (the same Arrow types as
`pooler batch`, see pooler/batch/columns.py) and `error`: null for rows that ran, the reason for
rows that could not (null, empty or non-text), whose output columns are null.

Fault tolerance is Ray Data's: a dead actor is restarted and its unfinished batches are run
again on the pool (actor max_restarts / max_task_retries are -1), and a batch's output only
counts once its task has finished, so every input row comes out exactly once.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from pooler.batch.columns import TaskOptions, compute_columns
from pooler.batch.job import row_problem


class EngineBatchPredictor:
    """The callable class of `map_batches`: one Engine per actor, a pyarrow batch in and out."""

    def __init__(self, engine_kwargs: dict, options: dict, text_column: str = "text"):
        from pooler.engine.llm import Engine

        kwargs = dict(engine_kwargs)
        self.engine = Engine(kwargs.pop("model"), **kwargs)
        self.options = TaskOptions(**options)
        self.text_column = text_column
        # The task's column types, for rows without output (an all-rejected batch too).
        probe = compute_columns(self.engine, ["probe"], self.options)
        self.types = {name: column.type for name, column in probe.items()}

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column(self.text_column).to_pylist()
        problems = [row_problem(t, None, False, None) for t in texts]
        good = [i for i, p in enumerate(problems) if p is None]
        bad = [i for i, p in enumerate(problems) if p is not None]
        parts = []
        if good:
            columns = compute_columns(self.engine, [texts[i] for i in good], self.options)
            parts.append(_with_columns(batch.take(good), columns, [None] * len(good)))
        if bad:
            empty = {name: pa.nulls(len(bad), type=t) for name, t in self.types.items()}
            parts.append(_with_columns(batch.take(bad), empty, [problems[i] for i in bad]))
        return pa.concat_tables(parts)


def _with_columns(table: pa.Table, columns: dict[str, pa.Array], errors: list) -> pa.Table:
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table.append_column("error", pa.array(errors, type=pa.string()))


def embed_dataset(ds, *, model: str, task: str = "embed", text_column: str = "text",
                  replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  batch_size: int = 1024, engine_kwargs: dict[str, Any] | None = None,
                  predictor_class: type = EngineBatchPredictor, **task_options):
    """A lazy Ray Dataset: `ds`'s rows plus the task's output columns and `error`.

    task: embed | sparse | token_embed | classify | ner. task_options: precision, dimensions,
    normalize, truncate, prompt_name, prompt, top_k, aggregation_strategy (see
    pooler.batch.columns.TaskOptions). engine_kwargs: Engine options (dtype, device,
    max_num_batched_tokens, num_threads, quantization, ...). num_cpus / num_gpus: what Ray
    reserves for each of the `replicas` actors; the engine uses `num_cpus` threads on CPU unless
    engine_kwargs sets num_threads. predictor_class: EngineBatchPredictor or a subclass (to
    add columns or hooks)."""
    import ray.data

    options = TaskOptions(task=task, **task_options)  # fail here, not on the actors
    kwargs = {"model": model, **(engine_kwargs or {})}
    if num_gpus:
        kwargs.setdefault("device", "cuda")
    elif kwargs.get("num_threads") is None:
        kwargs["num_threads"] = max(1, int(num_cpus))
    # Blocks of one batch each (streaming, no shuffle): a single big input file is otherwise a
    # few blocks, and a block goes to one actor, so the pool would sit idle.
    ds = ds.repartition(target_num_rows_per_block=batch_size)
    return ds.map_batches(
        predictor_class, batch_format="pyarrow", batch_size=batch_size,
        fn_constructor_kwargs={"engine_kwargs": kwargs, "options": options.to_dict(),
                               "text_column": text_column},
        compute=ray.data.ActorPoolStrategy(size=replicas), num_cpus=num_cpus,
        num_gpus=num_gpus or None)


def read_corpus(path: str, fmt: str | None, columns: list[str]):
    """A Ray Dataset of the corpus file (or directory) with just `columns`."""
    import ray.data

    from pooler.batch.reader import input_format

    fmt = input_format(path, fmt) if fmt or not Path(path).is_dir() else "parquet"
    if fmt == "parquet":
        return ray.data.read_parquet(path, columns=columns)
    ds = ray.data.read_json(path, lines=True) if fmt == "jsonl" else ray.data.read_csv(path)
    return ds.select_columns(columns)


def run_ray_batch(*, input: str, output: str, engine_kwargs: dict, options: TaskOptions,
                  text_column: str = "text", id_column: str | None = None,
                  input_format: str | None = None, errors: str | None = None,
                  replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  batch_size: int = 1024, address: str | None = None,
                  overwrite: bool = False) -> dict:
    """`pooler batch --ray`: read -> map_batches over `replicas` engine actors -> write_parquet.

    The output directory gets one Parquet file per written block with `id`, the task's columns
    and `error` (rejected rows are kept there with null outputs, and also listed in the errors
    file). On a multi-node cluster, input and output must be on storage every node sees."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads
    import ray

    if id_column is None:
        raise ValueError("--ray needs --id-column: Ray Data reads files in parallel and does "
                         "not number rows.")
    out = Path(output)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(f"--output {out} is not empty; --ray jobs do not resume (Ray "
                             "retries failed batches within the job): pick a new path or pass "
                             "--overwrite.")
        import shutil
        shutil.rmtree(out)
    started = time.perf_counter()
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    ds = read_corpus(input, input_format, [id_column, text_column])
    if id_column != "id":
        ds = ds.rename_columns({id_column: "id"})
    model = engine_kwargs["model"]
    rest = {k: v for k, v in engine_kwargs.items() if k != "model" and v is not None}
    result = embed_dataset(ds, model=model, text_column=text_column, replicas=replicas,
                           num_cpus=num_cpus, num_gpus=num_gpus, batch_size=batch_size,
                           engine_kwargs=rest, **options.to_dict())
    result.drop_columns([text_column]).write_parquet(str(out))
    # The errors file, from the written output (a streaming scan of two columns).
    table = pads.dataset(str(out), format="parquet")
    rows, rejected = 0, 0
    errors_path = Path(errors) if errors else out / "_errors.jsonl"
    with open(errors_path, "w", encoding="utf-8") as f:
        for batch in table.to_batches(columns=["id", "error"]):
            rows += batch.num_rows
            for row in batch.filter(pc.is_valid(batch.column("error"))).to_pylist():
                rejected += 1
                f.write(json.dumps({"id": row["id"], "error": row["error"]}) + "\n")
    return {"rows": rows - rejected, "errors": rejected, "errors_file": str(errors_path),
            "seconds": time.perf_counter() - started}
