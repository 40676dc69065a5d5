"""A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and a worker
node, each its own raylet, on 127.0.0.1), shared by the Ray tests and shut down after them."""
from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from tests.batch.conftest import corpus_texts, tiny_embedder, write_jsonl  # noqa: E402,F401


@pytest.fixture(scope="session")
def ray_cluster():
    from ray.cluster_utils import Cluster

    # Logical CPUs: two per node, so one engine actor per node still leaves room for Ray Data's
    # read and write tasks and Serve's controller and proxy.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # With one Serve proxy (on the head), let it route to both nodes' replicas alike instead of
    # preferring the head's (the cluster's processes inherit this environment).
    os.environ["RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "object_store_memory": 150 * 2**20, "include_dashboard": False})
    cluster.add_node(num_cpus=2, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
