"""Thin wrapper: the sentence-transformers FastAPI app now lives in pooler/bench/st_fastapi_app.py
(the peer of `pooler bench --workload server`).

    python benchmarks/st_fastapi_baseline.py MODEL_PATH PORT [THREADS]
"""
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    runpy.run_module("pooler.bench.st_fastapi_app", run_name="__main__")
