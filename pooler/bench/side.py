"""Run one side of one workload in this (fresh) process and write its SideResult as JSON.

    python -m pooler.bench.side WORKLOAD SIDE OPTIONS_JSON RESULT_JSON

The runner sets OMP/MKL thread variables in our environment before torch loads.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main(argv: list[str]) -> int:
    workload_name, side_name, options_json, result_path = argv
    import torch

    from pooler.bench.machine import peak_rss_mb
    from pooler.bench.registry import BenchOptions, get_workload

    opts = BenchOptions(**json.loads(options_json))
    torch.set_num_threads(opts.threads)
    workload = get_workload(workload_name)
    sides = {s.name: s for s in workload.sides(opts)}
    if side_name not in sides:
        raise SystemExit(f"workload {workload_name!r} has no side {side_name!r}; "
                         f"sides: {sorted(sides)}")
    out = sides[side_name].run(opts)
    results = out if isinstance(out, list) else [out]
    for result in results:
        # A side that measures another process (a server) reports that process's peak itself.
        result.peak_rss_mb = result.peak_rss_mb or peak_rss_mb()
    # The host's speed drifts (shared VMs: the same GEMM ran 185 and 345 GFLOP/s hours apart), so
    # a side with a ceiling column measures the GEMM rate next to its own timed part (after
    # its peak RSS is read: the GEMM's matrices are not the side's memory).
    if opts.device == "cpu" and not opts.quick and (
            workload.flops_per_token or any(r.model_flops for r in results)):
        from pooler.bench.machine import measure_gemm_gflops
        gemm = measure_gemm_gflops(opts.threads)
        for result in results:
            result.gemm_gflops = result.gemm_gflops or [gemm]
    for result in results:
        if result.role == "pooler" and not result.precision_path:
            from pooler.bench.common import ENGINE_PATHS
            result.precision_path = "; ".join(dict.fromkeys(ENGINE_PATHS))
        if result.role == "pooler" and not result.step_paths:
            from pooler.bench.common import ENGINE_STEP_PATHS
            # the last engine built: a side with two (interleaved) sets its own
            result.step_paths = ENGINE_STEP_PATHS[-1] if ENGINE_STEP_PATHS else {}
    with open(result_path, "w") as f:
        # a list when the side timed several libraries in one process
        json.dump([asdict(r) for r in results] if isinstance(out, list) else asdict(out), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
