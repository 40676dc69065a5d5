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
rows that could not (null, empty or non-text; with `image_column`, a missing or broken image,
pooler/batch/images.py), whose output columns are null.

Resources (pooler/ray/resources.py): the actors must fit the cluster, or the call fails at
once naming the cluster's CPUs; when they would take every CPU, their Ray reservations are
scaled down so that the read tasks can still run (else the job waits at 0 rows forever).

Fault tolerance is Ray Data's: a dead actor is restarted and its unfinished batches are run
again on the pool (actor max_restarts / max_task_retries are -1), and a batch's output only
counts once its task has finished, so every input row comes out exactly once. `pooler batch
--ray` (pooler/ray/job.py) adds resume across runs and a no-progress bound.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from pooler.batch.columns import TaskOptions, compute_columns
from pooler.batch.images import (check_image_model, check_image_task, compute_image_rows,
                                 image_item)
from pooler.batch.job import row_problem
from pooler.ray.resources import ActorPlan, cluster_nodes, plan_actors


class EngineBatchPredictor:
    """The callable class of `map_batches`: one Engine per actor, a pyarrow batch in and out."""

    def __init__(self, engine_kwargs: dict, options: dict, text_column: str = "text",
                 id_column: str | None = None, image_column: str | None = None,
                 image_root: str | None = None):
        from pooler.engine.llm import Engine

        kwargs = dict(engine_kwargs)
        self.engine = Engine(kwargs.pop("model"), **kwargs)
        self.options = TaskOptions(**options)
        self.text_column = text_column
        self.id_column = id_column  # rows with a null id are rejected when given
        self.image_column = image_column  # rows are images (pooler/batch/images.py)
        self.image_root = image_root      # relative image paths' folder
        if image_column is not None:
            check_image_model(self.engine, self.options.task)
        # The task's column types, for rows without output (an all-rejected batch too); an
        # image model's texts give its images' types.
        probe = compute_columns(self.engine, ["probe"], self.options)
        self.types = {name: column.type for name, column in probe.items()}

    def __call__(self, batch: pa.Table) -> pa.Table:
        cells = batch.column(self.image_column or self.text_column).to_pylist()
        ids = batch.column(self.id_column).to_pylist() if self.id_column else [None] * len(cells)
        if self.image_column is None:
            problems = [row_problem(t, i, self.id_column is not None, None)
                        for t, i in zip(cells, ids)]
            good = [i for i, p in enumerate(problems) if p is None]
            columns = compute_columns(self.engine, [cells[i] for i in good], self.options) \
                if good else None
        else:
            columns, good, problems = self._images(cells, ids)
        bad = [i for i, p in enumerate(problems) if p is not None]
        parts = []
        if good:
            parts.append(_with_columns(batch.take(good), columns, [None] * len(good)))
        if bad or not good:  # the rejected rows (or the schema of an empty batch)
            empty = {name: pa.nulls(len(bad), type=t) for name, t in self.types.items()}
            parts.append(_with_columns(batch.take(bad), empty, [problems[i] for i in bad]))
        return pa.concat_tables(parts)

    def _images(self, cells: list, ids: list):
        """(columns, rows that ran, each row's problem or None) of a batch of image cells."""
        problems: list[str | None] = []
        items = []
        for cell, id_value in zip(cells, ids):
            item, why = (None, "null id") if self.id_column and id_value is None else \
                image_item(cell, self.image_root)
            problems.append(why)
            items.append(item)
        good = [i for i, p in enumerate(problems) if p is None]
        labels = [ids[i] if self.id_column else i for i in good]  # errors name the id
        columns, kept, failed = compute_image_rows(self.engine, [items[i] for i in good], labels,
                                                   self.options, self.image_column)
        for at, why in failed.items():
            problems[good[at]] = why
        return columns, [good[at] for at in kept], problems


def _with_columns(table: pa.Table, columns: dict[str, pa.Array], errors: list) -> pa.Table:
    for name, column in columns.items():
        table = table.append_column(name, column)
    return table.append_column("error", pa.array(errors, type=pa.string()))


def embed_dataset(ds, *, model: str, task: str = "embed", text_column: str = "text",
                  replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0,
                  batch_size: int = 1024, engine_kwargs: dict[str, Any] | None = None,
                  predictor_class: type = EngineBatchPredictor, plan: ActorPlan | None = None,
                  repartition: bool = True, id_column: str | None = None,
                  image_column: str | None = None, image_root: str | None = None,
                  **task_options):
    """A lazy Ray Dataset: `ds`'s rows plus the task's output columns and `error`.

    image_column: embed that column's images instead of `text_column`'s texts (a file path,
    absolute or relative to `image_root`; encoded bytes; a data URL; see
    pooler/batch/images.py): task "embed" for image-text models, "token_embed" for page
    retrieval models. Every actor must see the files (shared storage on a cluster).

    task: embed | sparse | token_embed | classify | ner. task_options: precision, dimensions,
    normalize, truncate, prompt_name, prompt, top_k, pool_factor, aggregation_strategy (see
    pooler.batch.columns.TaskOptions). engine_kwargs: Engine options (dtype, device,
    max_num_batched_tokens, num_threads, quantization, ...). num_cpus / num_gpus: per actor, for
    each of the `replicas` actors; the engine uses `num_cpus` threads on CPU unless
    engine_kwargs sets num_threads. predictor_class: EngineBatchPredictor or a subclass (to
    add columns or hooks).

    The actors must fit the connected cluster (ValueError naming its CPUs otherwise), and leave
    one CPU for `ds`'s read tasks: on a cluster they would fill, each actor's Ray reservation is
    scaled down (pooler/ray/resources.py). plan: a reservation already worked out (`pooler
    batch --ray`, whose own tasks ask less). repartition: cut `ds` into blocks of `batch_size`
    rows first (False when `ds` already has them)."""
    import ray
    import ray.data

    options = TaskOptions(task=task, **task_options)  # fail here, not on the actors
    if image_column is not None:
        check_image_task(task)
    if plan is None:
        if not ray.is_initialized():
            ray.init()
        plan = plan_actors(*cluster_nodes(), replicas=replicas, num_cpus=num_cpus,
                           num_gpus=num_gpus, task_room=1.0)
    kwargs = {"model": model, **(engine_kwargs or {})}
    if num_gpus:
        kwargs.setdefault("device", "cuda")
    elif kwargs.get("num_threads") is None:
        kwargs["num_threads"] = plan.threads
    if repartition:
        # Blocks of one batch each (streaming, no shuffle): a single big input file is
        # otherwise a few blocks, and a block goes to one actor, so the pool would sit idle.
        ds = ds.repartition(target_num_rows_per_block=batch_size)
    return ds.map_batches(
        predictor_class, batch_format="pyarrow", batch_size=batch_size,
        fn_constructor_kwargs={"engine_kwargs": kwargs, "options": options.to_dict(),
                               "text_column": text_column, "id_column": id_column,
                               "image_column": image_column, "image_root": image_root},
        compute=ray.data.ActorPoolStrategy(size=replicas), num_cpus=plan.actor_cpus,
        num_gpus=plan.actor_gpus or None)


def read_corpus(path: str, fmt: str | None, columns: list[str], num_cpus: float | None = None):
    """A Ray Dataset of the corpus file (or directory); Parquet with just `columns`, JSONL and
    CSV with all of theirs (select them in a later map: a `select_columns` step would be a
    task of its own, asking a whole CPU). num_cpus: what each read task asks (None: Ray's
    default)."""
    import ray.data

    from pooler.batch.reader import input_format

    fmt = input_format(path, fmt) if fmt or not Path(path).is_dir() else "parquet"
    args = {} if num_cpus is None else {"num_cpus": num_cpus}
    if fmt == "parquet":
        return ray.data.read_parquet(path, columns=columns, **args)
    if fmt == "jsonl":
        return ray.data.read_json(path, lines=True, **args)
    return ray.data.read_csv(path, **args)
