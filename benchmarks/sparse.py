"""Thin wrapper: the `sparse` workload of `pooler bench` (pooler/bench/workloads/sparse.py), kept so old
commands still work. Extra arguments go to `pooler bench` (e.g. --threads 2 --quick).

    python benchmarks/sparse.py [pooler bench options]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pooler.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "--workload", "sparse", *sys.argv[1:]]))
