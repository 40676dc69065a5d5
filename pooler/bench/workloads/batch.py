"""Corpus-job workload: a JSONL corpus in, embeddings out, whole jobs timed.

Sides: `pooler batch` on one machine (pooler/batch/job.py, Parquet part files), the same job
on Ray Data with 1 and 2 engine actors (pooler/ray/data.py; Ray started before the clock, as a
running cluster is), and sentence-transformers' multi-process encode (`encode` with a pool of
2 CPU processes, what `encode_multi_process` became). Every side's time includes loading the
model (in each actor / process) and, for pooler, reading the file and writing Parquet. The
point is overhead: Ray with 1 replica against local, on the same cores.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pooler.bench import corpus
from pooler.bench.common import save_array, token_lens
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register
from pooler.install_hint import install_command


def _texts(opts: BenchOptions) -> list[str]:
    return corpus.mixed_corpus(64 if opts.quick else int(opts.extra.get("corpus_size", 2000)))


def _write_corpus(opts: BenchOptions, folder: Path) -> Path:
    path = folder / "corpus.jsonl"
    with open(path, "w") as f:
        for i, text in enumerate(_texts(opts)):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


def _engine_kwargs(opts: BenchOptions, threads: int) -> dict:
    return {"dtype": opts.dtype, "device": opts.device, "num_threads": threads,
            "max_num_batched_tokens": opts.max_num_batched_tokens,
            "max_num_seqs": opts.max_num_seqs, "quantization": opts.quantization}


def _result(side: str, role: str, opts: BenchOptions, seconds: float, vectors: np.ndarray,
            note: str = "") -> SideResult:
    texts = _texts(opts)
    return SideResult(side, role, len(texts), sum(token_lens(opts.model, texts)), seconds,
                      note=note, outputs_file=save_array(opts, f"batch-{side}", vectors))


def _local(opts: BenchOptions) -> SideResult:
    import pyarrow.parquet as pq

    from pooler.batch.job import BatchSpec, run_batch
    from pooler.engine.llm import Engine

    with tempfile.TemporaryDirectory() as tmp:
        source = _write_corpus(opts, Path(tmp))
        start = time.perf_counter()
        report = run_batch(BatchSpec(input=str(source), model=opts.model, id_column="id"),
                           Path(tmp) / "out", lambda: Engine(
                               opts.model, **_engine_kwargs(opts, opts.threads)),
                           progress=False)
        seconds = time.perf_counter() - start
        table = pq.read_table(Path(tmp) / "out")
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    return _result("pooler batch", "pooler", opts, seconds, vectors,
                   note=f"{report.parts} parts, {opts.threads} threads")


def _ray(replicas: int):
    def run(opts: BenchOptions) -> SideResult:
        import pyarrow.parquet as pq
        import ray

        from pooler.batch.columns import TaskOptions
        from pooler.ray.job import run_ray_batch

        threads = max(1, opts.threads // replicas)
        # One logical CPU more than the actors take, for Ray Data's read and write tasks.
        ray.init(num_cpus=replicas * threads + 1, include_dashboard=False,
                 log_to_driver=False)
        with tempfile.TemporaryDirectory() as tmp:
            source = _write_corpus(opts, Path(tmp))
            start = time.perf_counter()
            run_ray_batch(input=str(source), output=str(Path(tmp) / "out"),
                          engine_kwargs={"model": opts.model, **_engine_kwargs(opts, threads)},
                          options=TaskOptions(), id_column="id", replicas=replicas,
                          num_cpus=threads, batch_size=512)
            seconds = time.perf_counter() - start
            table = pq.read_table(Path(tmp) / "out").sort_by("id")
        ray.shutdown()
        vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
        return _result(f"pooler batch --ray x{replicas}", "pooler", opts, seconds, vectors,
                       note=f"{replicas} actor(s) x {threads} thread(s)")
    return run


def _st_multi_process(opts: BenchOptions) -> SideResult:
    import torch
    from sentence_transformers import SentenceTransformer

    from pooler.model_folder import resolve_model_path

    processes = 2
    texts = _texts(opts)
    torch.set_num_threads(max(1, opts.threads // processes))
    start = time.perf_counter()
    model = SentenceTransformer(str(resolve_model_path(opts.model)), device="cpu")
    pool = model.start_multi_process_pool(["cpu"] * processes)
    try:
        vectors = model.encode(texts, pool=pool, batch_size=32)
    finally:
        model.stop_multi_process_pool(pool)
    seconds = time.perf_counter() - start
    return _result("ST multi-process", "peer", opts, seconds, np.asarray(vectors),
                   note=f"{processes} processes, batch 32")


def _skip(opts: BenchOptions) -> str | None:
    if opts.device == "cuda":
        return "the batch workload compares CPU processes and actors on this machine"
    try:
        import pyarrow  # noqa: F401
        import ray  # noqa: F401
    except ImportError:
        return f"needs Ray ({install_command('ray')})"
    return None


register(Workload(
    name="batch",
    description="corpus job (--corpus-size mixed texts, JSONL -> Parquet): pooler batch local vs "
                "--ray with 1 and 2 actors vs sentence-transformers multi-process encode",
    metric="throughput",
    sides=lambda opts: [Side("pooler batch", "pooler", _local),
                        Side("pooler batch --ray x1", "pooler", _ray(1)),
                        Side("pooler batch --ray x2", "pooler", _ray(2)),
                        Side("ST multi-process", "peer", _st_multi_process)],
    baseline="ST multi-process",
    baselines={"pooler batch --ray x1": "pooler batch", "pooler batch --ray x2": "pooler batch"},
    skip=_skip))
