"""`pooler bench --background-load N`: N busy processes compete for the cores while the sides
run, as on a shared machine (other replicas, noisy neighbours, a CPU-quota'd container).

Each process is a pure-Python spin loop (one core's worth of demand, no memory traffic to
speak of), started before a run and killed after it; pooler and its peer see the same load.

Each starts in its own session. With the kernel's autogroup scheduling (on by default on most
distributions) the scheduler first shares CPU time between sessions, then between the threads
inside one; a spinner in the bench's own session would only compete with the bench inside its
share, which is not what a neighbour does. A neighbour is another service, container or user:
its own session or cgroup, competing with this process as a whole.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

# Spins until killed, or until its parent (the bench) is gone: in their own sessions the
# spinners would not see the terminal's Ctrl-C, and must not outlive a killed bench.
_SPIN = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
         "    for _ in range(100_000):\n        pass\n")


@contextlib.contextmanager
def background_load(num_processes: int):
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
             for _ in range(max(0, num_processes))]
    try:
        if procs:
            time.sleep(0.5)  # let them start spinning before the side loads
            dead = [p.args for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"background load process exited early: {dead[0]}")
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
