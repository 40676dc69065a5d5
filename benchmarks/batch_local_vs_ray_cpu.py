"""CPU seconds and wall time of the batch workload's corpus: the local job vs one Ray actor
(docs/scale-out.md, "Ray with one actor faster than local" withdrawn).

    .venv/bin/python benchmarks/batch_local_vs_ray_cpu.py [--order L,R,R,L] [--texts 400]

Each side runs in a fresh process, alternating in --order. The local side measures
`time.process_time()` of its own process around `run_batch`; the Ray side (a local Ray of 3
logical CPUs, one actor of 2) measures it inside the actor, from before the Engine loads to its
last batch. Both include loading the model. Equal CPU seconds with unequal wall times mean the
two sides got different shares of the machine, not that the engine worked differently.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def side(name: str, texts: int) -> dict:
    import pooler  # noqa: F401  (sets the OpenMP spin before torch, as the CLI does)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pooler.batch.columns import TaskOptions
    from pooler.bench import corpus

    tmp = Path(tempfile.mkdtemp())
    src = tmp / "corpus.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                           for i, t in enumerate(corpus.mixed_corpus(texts))))
    kwargs = {"num_threads": 2}
    if name == "L":
        from pooler.batch.job import BatchSpec, run_batch
        from pooler.engine.llm import Engine

        cpu, wall = time.process_time(), time.perf_counter()
        run_batch(BatchSpec(input=str(src), model=MODEL, id_column="id"), tmp / "out",
                  lambda: Engine(MODEL, **kwargs), progress=False)
        return {"side": "local", "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu}
    import ray
    import ray.cloudpickle

    from pooler.ray.data import EngineBatchPredictor
    from pooler.ray.job import run_ray_batch

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class Timed(EngineBatchPredictor):
        def __init__(self, *args, **kw):
            self.cpu0 = time.process_time()
            super().__init__(*args, **kw)

        def __call__(self, batch):
            out = super().__call__(batch)
            return out.append_column(
                "cpu_s", pa.array([time.process_time() - self.cpu0] * len(out)))

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    wall = time.perf_counter()
    run_ray_batch(input=str(src), output=str(tmp / "out"), engine_kwargs={"model": MODEL,
                                                                          **kwargs},
                  options=TaskOptions(), id_column="id", replicas=1, num_cpus=2,
                  batch_size=512, predictor_class=Timed)
    wall = time.perf_counter() - wall
    cpu = max(pq.read_table(tmp / "out", columns=["cpu_s"]).column("cpu_s").to_pylist())
    ray.shutdown()
    return {"side": "ray x1", "wall_s": wall, "cpu_s": cpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--order", default="L,R,R,L")
    p.add_argument("--texts", type=int, default=400)
    p.add_argument("--side", default=None, help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    if args.side:
        print(json.dumps(side(args.side, args.texts)), flush=True)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
           "TOKENIZERS_PARALLELISM": "true", "HF_HUB_OFFLINE": "1"}
    for name in args.order.split(","):
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--side", name, "--texts",
                              str(args.texts)], env=env, capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()[-1]
        row = json.loads(out)
        print(f"{row['side']:7s} wall {row['wall_s']:6.1f} s  cpu {row['cpu_s']:6.1f} s  "
              f"load before {load:.1f}", flush=True)


if __name__ == "__main__":
    main()
