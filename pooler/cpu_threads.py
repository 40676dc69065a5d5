"""How many CPU threads this process may really use, and OpenMP settings that behave when the
cores are shared.

`os.cpu_count()` is the host's core count; a container with a CPU quota, a process pinned with
taskset, or several replicas on one node get far less. Too many threads for the CPU time at hand
is expensive: OpenMP's threads meet at a barrier after every parallel loop, and one thread that
the kernel has descheduled (or whose cgroup has used its quota) stalls all the others.

How long an idle OpenMP thread spins before it sleeps matters as much. libgomp's default spin
(300,000 iterations, milliseconds) burns the CPU time a descheduled peer needs: one short query
at load average 5.5, 2 threads, took 488 ms (issue 14); with 2 busy neighbours its p90 was
133-180 ms. Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs the other way: every parallel loop
must wake its threads, 1.6x on a quiet short query (8.7 vs 5.3 ms). A short spin
(GOMP_SPINCOUNT=10000, tens of microseconds) keeps the quiet figure and bounds the waste; the
step-thread rule (pooler/worker/step_threads.py) takes small steps to one thread while the cores
are contended, where no thread waits at all (docs/dev/journal.md, "OpenMP spin and the
contention rule").

OpenMP reads these once, when torch loads libgomp, so they must be in the environment before
`import torch`: `import pooler` (before torch), `pooler` and `python -m pooler` set
GOMP_SPINCOUNT when the user set neither it nor OMP_WAIT_POLICY (prefer_short_openmp_spin).
Code that imports torch first sets `GOMP_SPINCOUNT=10000` itself.

Imports nothing heavy (no torch): the CLI calls this before torch loads.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


# Spin iterations before an idle libgomp thread sleeps (its own default: 300,000).
SHORT_SPIN_COUNT = "10000"


def prefer_short_openmp_spin(environ=os.environ) -> bool:
    """Set GOMP_SPINCOUNT to a short spin unless the user chose a wait policy or spin count.
    Returns whether it set it. Only has an effect before torch is imported."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SHORT_SPIN_COUNT
    return True


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs the cgroup quota allows this process (e.g. 1.5), or None without a quota.

    cgroup v2: `cpu.max` ("QUOTA PERIOD" or "max PERIOD"); cgroup v1: `cpu.cfs_quota_us` /
    `cpu.cfs_period_us` (-1 = none). The own group and its ancestors are read and the smallest
    quota wins, since a parent's quota caps its children too."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    limits = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, group = parts
        if controllers == "":  # v2 unified hierarchy
            for folder in _ancestors(root, group):
                limits.append(_read_v2(folder / "cpu.max"))
        elif "cpu" in controllers.split(","):
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    for folder in _ancestors(mount, group):
                        limits.append(_read_v1(folder))
                    break
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def _ancestors(mount: Path, group: str) -> list[Path]:
    """The group's folder and its parents up to the mount (inside a container the group path
    may not exist under the mount: then only the mount itself is read)."""
    parts = [p for p in group.strip("/").split("/") if p]
    folders = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _read_v2(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max" or int(period) <= 0:
        return None
    return int(quota) / int(period)


def _read_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def affinity_cpus() -> int:
    """CPUs this process may be scheduled on (taskset, cpuset); the host count elsewhere."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> int:
    """Threads worth running: the CPUs in our affinity mask, capped by the cgroup quota
    (rounded down: a 1.5-CPU quota gives 1 thread, since a second thread would be throttled
    for a third of every period), at least 1."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def default_num_threads() -> int:
    """POOLER_NUM_THREADS when set, else available_cpus()."""
    value = os.environ.get("POOLER_NUM_THREADS")
    if value:
        threads = int(value)
        if threads <= 0:
            raise ValueError(f"POOLER_NUM_THREADS must be a positive integer, got {value!r}.")
        return threads
    return available_cpus()
