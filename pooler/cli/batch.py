"""`pooler batch`: embed (or classify, tag, ...) a whole corpus file into Parquet part files.

One machine by default (pooler/batch/job.py: resumable, bad rows to an errors file); with
--ray the same job runs as a Ray Data pipeline over N engine actors (pooler/ray/data.py).
"""
from __future__ import annotations

import sys

from pooler.cli.common import (add_engine_args, add_truncation_arg, engine_from_args,
                               split_labels)
from pooler.install_hint import install_command


def add_parser(sub) -> None:
    p = sub.add_parser(
        "batch", help="run a corpus file (jsonl, parquet, csv) into Parquet",
        description="Run every row of a corpus through the model and write Parquet part files "
                    "(id + outputs) into the --output directory. Re-running the same command "
                    "resumes after the last completed part. Rows that cannot be used (null, "
                    "empty or non-text; a missing or broken image) go to an errors file. "
                    "Needs pyarrow (the [batch] extra; [ray] for --ray).")
    add_engine_args(p, task=False)
    p.add_argument("--task", default="embed",
                   choices=["embed", "sparse", "token_embed", "classify", "ner"],
                   help="what to compute per row (default: %(default)s)")
    p.add_argument("--input", "-i", required=True, help="corpus.jsonl, .parquet or .csv")
    p.add_argument("--input-format", default=None, choices=["jsonl", "parquet", "csv"],
                   help="when the file name does not tell")
    p.add_argument("--text-column", default=None, help="default: text")
    p.add_argument("--image-column", default=None, metavar="COLUMN",
                   help="embed images instead of texts: each cell is an image file path "
                        "(absolute, or relative to --image-root), encoded image bytes (a "
                        "Parquet binary column) or a data:image/...;base64 URL. --task embed "
                        "for image-text models (CLIP, SigLIP), token_embed for page retrieval "
                        "models (ColModernVBert, ColPali, ColQwen2)")
    p.add_argument("--image-root", default=None, metavar="DIR",
                   help="folder relative image paths are read from (default: the --input "
                        "file's folder)")
    p.add_argument("--id-column", default=None,
                   help="column copied to the output's id (default: the row number)")
    p.add_argument("--output", "-o", required=True,
                   help="output directory of Parquet part files, e.g. out.parquet")
    p.add_argument("--errors", default=None,
                   help="JSONL file of rejected rows (default: OUTPUT/_errors.jsonl)")
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="rows per part file (default: 4096; 512 for token_embed or an image "
                        "column; with --ray about that many)")
    p.add_argument("--precision", default="float32",
                   choices=["float32", "float16", "int8", "binary"],
                   help="dense vector storage: int8 = round(clip(x,-1,1)*127), binary = sign "
                        "bits packed in uint8 (default: %(default)s)")
    p.add_argument("--dimensions", type=int, default=None, help="embed: Matryoshka truncation")
    p.add_argument("--no-normalize", action="store_true", help="embed: skip L2 normalization")
    add_truncation_arg(p)
    p.add_argument("--prompt-name", default=None, help="a prompt the model declares")
    p.add_argument("--prompt", default=None, help="a literal prefix for every text")
    p.add_argument("--top-k", type=int, default=None, help="sparse: keep the k largest weights")
    p.add_argument("--pool-factor", type=float, default=None,
                   help="token_embed with a ColBERT or page retrieval model: hierarchical token "
                        "pooling, about 1/FACTOR of each row's vectors kept")
    p.add_argument("--aggregation-strategy", default="simple",
                   choices=["none", "simple", "first", "max", "average"], help="ner")
    p.add_argument("--labels", action="append", default=None, metavar="LABELS",
                   help="ner with a GLiNER model: entity types, comma-separated (repeatable)")
    p.add_argument("--threshold", type=float, default=None,
                   help="ner with a GLiNER model: keep spans above this (default 0.5)")
    p.add_argument("--nested", action="store_true",
                   help="ner with a GLiNER model: allow an entity inside another")
    p.add_argument("--overwrite", action="store_true",
                   help="delete what OUTPUT holds and start again")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    ray = p.add_argument_group("Ray Data (pooler's [ray] extra)")
    ray.add_argument("--ray", action="store_true",
                     help="run as a Ray Data pipeline with one engine per actor")
    ray.add_argument("--ray-address", default=None,
                     help="cluster to join, e.g. ray://head:10001 or auto (default: start a "
                          "local Ray)")
    ray.add_argument("--replicas", type=int, default=1, help="engine actors (default: 1)")
    ray.add_argument("--num-cpus-per-replica", type=float, default=1.0,
                     help="CPUs Ray reserves per actor (default: %(default)s)")
    ray.add_argument("--num-gpus-per-replica", type=float, default=0.0,
                     help="GPUs per actor, e.g. 1 (default: %(default)s)")
    ray.add_argument("--batch-size", type=int, default=None,
                     help="rows per map_batches call (default: 1024; 64 with --image-column)")
    ray.add_argument("--stall-timeout", type=float, default=600.0, metavar="SECONDS",
                     help="stop with an error when the job makes no progress (no block read, "
                          "computed or written) for this long (default: %(default)s)")
    p.set_defaults(func=run)


def task_options(args):
    from pooler.batch.columns import TaskOptions

    return TaskOptions(task=args.task, precision=args.precision, dimensions=args.dimensions,
                       normalize=False if args.no_normalize else None,
                       truncate=not args.no_truncate, prompt_name=args.prompt_name,
                       prompt=args.prompt, top_k=args.top_k, pool_factor=args.pool_factor,
                       aggregation_strategy=args.aggregation_strategy,
                       labels=split_labels(args.labels),
                       threshold=args.threshold, flat_ner=False if args.nested else None)


def run(args) -> int:
    args.engine_task = None  # the model's own task; --task picks the Engine method
    _require_pyarrow()
    if args.ray:
        return _run_ray(args)
    from pooler.batch.job import BatchSpec, run_batch

    spec = BatchSpec(input=args.input, model=args.model, text_column=_text_column(args),
                     id_column=args.id_column, chunk_rows=_chunk_rows(args),
                     input_format=args.input_format, options=task_options(args),
                     image_column=args.image_column, image_root=args.image_root)
    report = run_batch(spec, args.output, lambda: engine_from_args(args),
                       errors_file=args.errors, progress=not args.no_progress,
                       overwrite=args.overwrite)
    resumed = f", {report.resumed_parts} resumed" if report.resumed_parts else ""
    print(f"wrote {report.rows} rows in {report.parts} parts{resumed} to {report.output}; "
          f"{report.errors} rejected rows in {report.errors_file} ({report.seconds:.1f}s)",
          file=sys.stderr)
    return 0


def _text_column(args) -> str:
    if args.image_column is not None and args.text_column is not None:
        raise ValueError("pass --text-column or --image-column, not both: a job embeds one "
                         "column.")
    return args.text_column or "text"


def _chunk_rows(args) -> int:
    return args.chunk_rows or (512 if args.task == "token_embed" or args.image_column
                               else 4096)


def _batch_size(args) -> int:
    """Rows per Ray map_batches call: fewer for images (their bytes travel in the block)."""
    return args.batch_size or (64 if args.image_column else 1024)


def ray_job_kwargs(args) -> dict:
    """run_ray_batch's arguments for these command-line options."""
    from pooler.cli.common import engine_kwargs

    return dict(input=args.input, input_format=args.input_format, output=args.output,
                errors=args.errors, engine_kwargs=engine_kwargs(args),
                options=task_options(args), text_column=_text_column(args),
                image_column=args.image_column, image_root=args.image_root,
                id_column=args.id_column, replicas=args.replicas,
                num_cpus=args.num_cpus_per_replica, num_gpus=args.num_gpus_per_replica,
                batch_size=_batch_size(args), chunk_rows=_chunk_rows(args),
                address=args.ray_address, overwrite=args.overwrite,
                stall_timeout=args.stall_timeout, progress=not args.no_progress)


def _run_ray(args) -> int:
    from pooler.ray.job import JobStalled, run_ray_batch

    try:
        report = run_ray_batch(**ray_job_kwargs(args))
    except JobStalled as exc:
        print(f"pooler batch: error: {exc}", file=sys.stderr)
        return 1
    resumed = f", {report['resumed_rows']} rows from an earlier run kept" \
        if report["resumed_rows"] else ""
    print(f"wrote {report['written_rows']} rows to {args.output} ({report['parts']} parts"
          f"{resumed}); {report['errors']} rejected rows in {report['errors_file']} "
          f"({report['seconds']:.1f}s, {args.replicas} replicas on {report['cluster_cpus']:g} "
          f"CPUs: {report['plan']})", file=sys.stderr)
    return 0


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("pooler batch needs pyarrow (pooler's [batch] extra). Install it "
                         f"with: {install_command('batch')}") from None
