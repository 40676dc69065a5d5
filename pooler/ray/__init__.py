"""Ray adapters (pip install 'pooler[ray]'): corpus jobs on Ray Data and serving on Ray Serve.

    from pooler.ray import embed_dataset          # a Ray Dataset in, outputs added per row
    from pooler.ray import serve_app              # a Ray Serve application of `pooler serve`

An entry-point layer: it imports the engine, the batch columns and the server; nothing in the
core imports it, and `import pooler` never imports ray.
"""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("embed_dataset", "EngineBatchPredictor"):
        from pooler.ray import data

        return getattr(data, name)
    if name in ("run_ray_batch", "JobStalled"):
        from pooler.ray import job

        return getattr(job, name)
    if name in ("serve_app", "PoolerDeployment", "app_builder"):
        from pooler.ray import serve

        return getattr(serve, name)
    raise AttributeError(f"module 'pooler.ray' has no attribute {name!r}")
