"""Side-by-side benchmarks: pooler against the library a user would otherwise run.

`pooler bench` (pooler/cli/bench.py) runs every side of a workload in its own subprocess, on the
same deterministic inputs and thread count, and prints one table. Workloads register themselves
in pooler/bench/registry.py; see pooler/bench/workloads/embed.py for the pattern.
"""
