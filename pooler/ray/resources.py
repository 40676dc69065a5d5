"""What each engine actor asks Ray for, and whether the cluster can run the job at all.

Ray's CPUs are logical: a scheduling token, not a core. An actor pool that takes every logical
CPU leaves none for Ray Data's read tasks, and the job sits at 0 rows forever (Ray Data
backpressures the read on its CPU budget while the actors wait for input). So:

- the pool may take at most the cluster's CPUs; a job that asks more is refused at once, with
  the cluster's CPUs and the ask in the message (Ray itself would wait forever for them);
- when the actors would leave less room than the pipeline's own tasks need (read, repartition,
  resume filter), each actor's reservation is scaled down to leave that room. `pooler batch
  --ray` makes its tasks ask TASK_CPUS each and keeps TASK_ROOM free; `embed_dataset` on a
  Dataset the caller read (read tasks at Ray's default of 1 CPU) keeps one CPU free. The
  engine still runs the threads that were asked for: the actors do the compute, the tasks
  only move Arrow blocks, and a reservation is not a limit.

No Ray import here: the plan is plain arithmetic on the cluster's node list, so it can be
tested (and read) without a cluster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

TASK_CPUS = 0.25   # logical CPUs per read / repartition / filter task when room is tight
TASK_ROOM = 0.5    # logical CPUs kept free for those tasks: two of them at a time


@dataclass(frozen=True)
class ActorPlan:
    actor_cpus: float          # logical CPUs Ray reserves per actor
    actor_gpus: float          # GPUs per actor
    task_cpus: float | None    # logical CPUs per pipeline task (None: Ray's default, 1)
    threads: int               # engine threads per actor (on CPU)
    cluster_cpus: float
    cluster_gpus: float

    def describe(self) -> str:
        tasks = "Ray's default" if self.task_cpus is None else f"{self.task_cpus:g}"
        return (f"{self.actor_cpus:g} logical CPU(s) per actor, {tasks} per read task, "
                f"{self.threads} engine thread(s) per actor")


def plan_actors(node_cpus: list[float], node_gpus: list[float], *, replicas: int,
                num_cpus: float, num_gpus: float = 0.0, task_room: float = 1.0,
                task_cpus: float | None = None) -> ActorPlan:
    """The reservation per actor for `replicas` actors of `num_cpus` / `num_gpus` on a cluster
    whose alive nodes have `node_cpus` / `node_gpus`; ValueError if they cannot all run.

    task_room: logical CPUs the actors must leave free for the pipeline's tasks (Ray Data), 0
    for Ray Serve (its controller and proxies ask no CPU). task_cpus: what each of those tasks
    asks when the room is tight (None: Ray's default, 1); with room to spare they keep Ray's
    default."""
    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}.")
    if num_cpus < 0 or num_gpus < 0 or (num_cpus == 0 and num_gpus == 0):
        raise ValueError(f"--num-cpus-per-replica must be positive (or set "
                         f"--num-gpus-per-replica), got {num_cpus:g}.")
    cpus, gpus = sum(node_cpus), sum(node_gpus)
    ask = f"--replicas {replicas} x --num-cpus-per-replica {num_cpus:g}"
    if num_gpus:
        ask += f" and --num-gpus-per-replica {num_gpus:g}"
        if replicas * num_gpus > gpus + 1e-9:
            raise ValueError(f"{ask} needs {replicas * num_gpus:g} GPUs; the Ray cluster has "
                             f"{gpus:g} GPUs. Lower --replicas or --num-gpus-per-replica, or add "
                             "GPU nodes.")
    fit = _actors_that_fit(node_cpus, num_cpus)
    if fit < replicas:
        raise ValueError(
            f"{ask} asks for {replicas * num_cpus:g} CPUs; the Ray cluster has {cpus:g} CPUs "
            f"({_nodes(node_cpus)}), where at most {fit} such replicas fit. Ray would wait "
            f"for the missing CPUs forever: lower --replicas or --num-cpus-per-replica, or add "
            f"nodes.")
    threads = max(1, int(num_cpus))
    asked = replicas * num_cpus
    if task_room <= 0 or num_cpus == 0 or cpus - asked >= task_room:
        return ActorPlan(num_cpus, num_gpus, None, threads, cpus, gpus)
    if cpus <= task_room:
        raise ValueError(f"the Ray cluster has {cpus:g} CPUs: too few to run engine actors "
                         f"beside Ray Data's read tasks, which need {task_room:g}; give Ray "
                         "more CPUs.")
    # Scale each reservation down so the actors leave `task_room` free in all.
    scaled = math.floor(num_cpus * (cpus - task_room) / asked * 1000) / 1000
    return ActorPlan(scaled, num_gpus, task_cpus, threads, cpus, gpus)


def _actors_that_fit(node_cpus: list[float], num_cpus: float) -> int:
    if num_cpus == 0:
        return 1 << 30
    return sum(int(c / num_cpus + 1e-9) for c in node_cpus)


def _nodes(node_cpus: list[float]) -> str:
    if len(node_cpus) == 1:
        return "one node"
    return f"{len(node_cpus)} nodes of " + ", ".join(f"{c:g}" for c in node_cpus)


def cluster_nodes() -> tuple[list[float], list[float]]:
    """(CPUs, GPUs) of each alive node of the connected Ray cluster."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    return ([float(n["Resources"].get("CPU", 0)) for n in alive],
            [float(n["Resources"].get("GPU", 0)) for n in alive])
