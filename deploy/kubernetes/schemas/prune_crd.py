"""Make rayservice-v1.json: the RayService v1 schema of a KubeRay CRD, pruned for the manifest
test (tests/unit/test_deploy_manifests.py).

    python deploy/kubernetes/schemas/prune_crd.py ray.io_rayservices.yaml > rayservice-v1.json

The CRD file: ray-operator/config/crd/bases/ray.io_rayservices.yaml of KubeRay (the checked-in
file came from tag v1.7.0). Descriptions are dropped, and the pod templates and Service
objects the CRD embeds (most of its megabyte) become plain objects: the test validates the pod
templates against Kubernetes' own PodTemplateSpec schema (kubernetes-validate) instead.
"""
from __future__ import annotations

import json
import sys

import yaml

# Embedded Kubernetes objects, validated separately (templates) or unused by the example.
EMBEDDED = {"template", "headService", "serveService", "ingressOptions", "autoscalerOptions",
            "networkPolicy", "historyServerOptions"}


def prune(node, key=None):
    if key in EMBEDDED and isinstance(node, dict):
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if isinstance(node, dict):
        return {k: prune(v, k) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [prune(v) for v in node]
    return node


def main(path: str) -> None:
    with open(path) as f:
        crd = yaml.safe_load(f)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = version["schema"]["openAPIV3Schema"]
    schema["properties"].pop("status", None)
    json.dump(prune(schema), sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
