"""`pooler bench --background-load`: the busy processes run in their own sessions (a neighbour's
scheduling group, not the bench's), are gone after the run, and do not outlive a killed bench."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from pooler.bench.background_load import background_load


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_spinners_run_in_their_own_sessions_and_stop_after():
    with background_load(2) as procs:
        assert len(procs) == 2
        assert all(p.poll() is None for p in procs)
        sessions = {os.getsid(p.pid) for p in procs}
        assert os.getsid(0) not in sessions and len(sessions) == 2
    assert all(p.returncode is not None for p in procs)


def test_spinner_exits_when_the_bench_dies_without_cleaning_up():
    parent = ("import os, sys\nfrom pooler.bench.background_load import background_load\n"
              "with background_load(1) as procs:\n"
              "    print(procs[0].pid, flush=True)\n"
              "    os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    pid = int(out.split()[0])
    deadline = time.monotonic() + 20
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _gone(pid)
    finally:
        if not _gone(pid):
            os.kill(pid, 9)
