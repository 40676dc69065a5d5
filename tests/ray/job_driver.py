"""`pooler batch --ray` drivers that the Ray tests run in a process of their own.

    python -m tests.ray.job_driver slow BATCH_ARGS...      the command's job, each batch 0.3 s
                                                           slower (a driver to SIGKILL midway)
    python -m tests.ray.job_driver own-ray BATCH_ARGS...   on a new single-node Ray whose logical
                                                           CPUs are os.cpu_count(): a refused ask,
                                                           --replicas = CPUs, a stuck job; prints
                                                           one JSON line of what happened

BATCH_ARGS are `pooler batch` options (without --ray / --replicas for own-ray).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time

import ray
import ray.cloudpickle

from pooler.cli.batch import ray_job_kwargs
from pooler.cli.main import build_parser, main
from pooler.ray.data import EngineBatchPredictor
from pooler.ray.job import JobStalled, run_ray_batch

# The predictors below are defined here: ship them to the actors by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Slow(EngineBatchPredictor):
    def __call__(self, batch):
        time.sleep(0.3)
        return super().__call__(batch)


class Stuck(EngineBatchPredictor):
    """Never answers: a job that can make no progress."""

    def __call__(self, batch):
        time.sleep(3600)
        return super().__call__(batch)


def job_kwargs(argv: list[str]) -> dict:
    args = build_parser().parse_args(["batch", *argv])
    args.engine_task = None
    return ray_job_kwargs(args)


def cli(argv: list[str]) -> tuple[int, str, float]:
    err = io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stderr(err):
        code = main(["batch", *argv])
    return code, err.getvalue(), time.monotonic() - start


def own_ray(argv: list[str]) -> dict:
    cpus = os.cpu_count()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    out: dict = {"cpus": cpus, "ray_cpus": ray.cluster_resources()["CPU"]}
    code, err, seconds = cli([*argv, "--ray", "--replicas", str(cpus + 1)])
    out["refused"] = {"code": code, "stderr": err, "seconds": seconds}
    code, err, seconds = cli([*argv, "--ray", "--replicas", str(cpus)])
    out["full"] = {"code": code, "stderr": err, "seconds": seconds}
    kwargs = job_kwargs([*argv, "--ray", "--replicas", "1", "--stall-timeout", "10"])
    kwargs["output"] += "-stuck"
    start = time.monotonic()
    try:
        run_ray_batch(**kwargs, predictor_class=Stuck)
        out["stuck"] = {"error": None}
    except JobStalled as exc:
        out["stuck"] = {"error": str(exc), "seconds": time.monotonic() - start}
    return out


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "slow":
        run_ray_batch(**job_kwargs(rest), predictor_class=Slow)
    elif mode == "own-ray":
        print(json.dumps(own_ray(rest)), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
