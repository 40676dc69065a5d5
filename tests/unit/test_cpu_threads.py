"""Thread count from what the process may really use (affinity, cgroup v1/v2 quota), the
OpenMP wait policy the CLI sets before torch loads, and one thread for tiny steps."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pooler.cpu_threads import (available_cpus, cgroup_cpu_limit, default_num_threads,
                                prefer_short_openmp_spin)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_and_the_smallest_ancestor_wins(tmp_path):
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "150000 100000\n")
    _write(tmp_path / "kubepods" / "cpu.max", "100000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1\n") == 1.0
    _write(tmp_path / "kubepods" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1\n") == 1.5


def test_cgroup_v2_without_quota(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None


def test_cgroup_v1_cfs_quota(tmp_path):
    folder = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    _write(folder / "cpu.cfs_quota_us", "50000\n")
    _write(folder / "cpu.cfs_period_us", "100000\n")
    text = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
    assert cgroup_cpu_limit(tmp_path, text) == 0.5
    _write(folder / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(tmp_path, text) is None


def test_available_cpus_rounds_a_quota_down_and_respects_affinity(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    _write(tmp_path / "cpu.max", "250000 100000\n")
    assert available_cpus(tmp_path, "0::/\n") == 2
    _write(tmp_path / "cpu.max", "50000 100000\n")
    assert available_cpus(tmp_path, "0::/\n") == 1  # a half-CPU quota still runs one thread
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert available_cpus(tmp_path, "0::/\n") == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert available_cpus(tmp_path, "0::/\n") == 1


def test_pooler_num_threads_overrides_and_is_checked(monkeypatch):
    monkeypatch.setenv("POOLER_NUM_THREADS", "3")
    assert default_num_threads() == 3
    monkeypatch.setenv("POOLER_NUM_THREADS", "0")
    with pytest.raises(ValueError, match="POOLER_NUM_THREADS"):
        default_num_threads()


def test_short_spin_keeps_a_users_choice():
    env = {}
    assert prefer_short_openmp_spin(env) and env == {"GOMP_SPINCOUNT": "10000"}
    env = {"OMP_WAIT_POLICY": "PASSIVE"}  # a chosen policy: no spin count added
    assert not prefer_short_openmp_spin(env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"GOMP_SPINCOUNT": "500"}
    assert not prefer_short_openmp_spin(env) and env == {"GOMP_SPINCOUNT": "500"}


_PROBE = "import sys, os\n{}\nprint('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))\n"


@pytest.mark.parametrize("entry", [["-m", "pooler", "--help"],
                                   ["-c", "import sys; from pooler.cli.main import main; "
                                          "sys.argv=['pooler', '--help']; main()"]])
def test_cli_sets_the_spin_before_torch_loads(entry):
    """`python -m pooler` and the `pooler` entry point import no torch before setting the
    spin; the check runs in a child whose environment has no OpenMP setting."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _PROBE.format("import pooler.cli.main")],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "10000"]
    rc = subprocess.run([sys.executable, *entry], env=env, capture_output=True, text=True)
    assert rc.returncode == 0 and "serve" in rc.stdout


def test_import_pooler_sets_the_spin_only_before_torch():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    first = subprocess.run([sys.executable, "-c", _PROBE.format("import pooler")], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert first == ["False", "10000"]
    # torch already loaded: libgomp has read its settings; setting one now would only mislead.
    late = subprocess.run([sys.executable, "-c", _PROBE.format("import torch, pooler")],
                          env=env, capture_output=True, text=True, check=True).stdout.split()
    assert late == ["True", "None"]


def test_engine_threads_default_and_the_single_thread_threshold(minilm_path, monkeypatch):
    import torch

    from pooler import Engine

    monkeypatch.delenv("POOLER_NUM_THREADS", raising=False)
    monkeypatch.setenv("POOLER_SINGLE_THREAD_BELOW_TOKENS", "32")
    # The contended rule would also pick one thread for the 40-word step on a busy machine.
    monkeypatch.setenv("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS", "0")
    before = torch.get_num_threads()
    try:
        engine = Engine(str(minilm_path))
        assert engine.config.num_threads == available_cpus()
        runner = engine.core.model_runner
        assert runner.step_threads.single_thread_below == 32
        seen = []
        real_apply = runner.step_threads.apply
        runner.step_threads.apply = lambda n: seen.append((n, real_apply(n))) or seen[-1][1]
        runner.step_threads.num_threads = 2
        engine.embed("hi")
        engine.embed(["word " * 40])
        assert seen[0][0] < 32 and seen[0][1] == 1
        assert seen[1][0] >= 32 and seen[1][1] == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_single_thread_threshold_defaults_off_and_is_checked(monkeypatch):
    from pooler.worker.step_threads import StepThreads

    monkeypatch.delenv("POOLER_SINGLE_THREAD_BELOW_TOKENS", raising=False)
    # The contended rule off: on a busy machine it would pick one thread for its own reason.
    monkeypatch.setenv("POOLER_CONTENDED_SINGLE_THREAD_BELOW_TOKENS", "0")
    assert StepThreads(2).threads_for(1) == 2
    monkeypatch.setenv("POOLER_SINGLE_THREAD_BELOW_TOKENS", "-3")
    with pytest.raises(ValueError, match="POOLER_SINGLE_THREAD_BELOW_TOKENS"):
        StepThreads(2)
