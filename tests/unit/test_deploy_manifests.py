"""The container and Kubernetes definitions under deploy/ and the Dockerfiles: valid against the
Kubernetes schemas (kubernetes-validate ships them offline), and consistent with what pooler
does (its port, /health, its drain timeout, the metric the autoscaler reads, the flags and
variables the entrypoint gets). No cluster or container runtime is needed."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

from pooler.cli import peer_flags  # noqa: E402
from pooler.cli.main import build_parser  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
# The newest Kubernetes the package knows, and an older one clusters still run.
VERSIONS = [kubernetes_validate.latest_version(), "1.30.0"]


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBE / name).read_text()) if d]


def by_kind(kind: str) -> dict:
    found = [d for name in ("deployment.yaml", "service.yaml", "hpa.yaml")
             for d in documents(name) if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["deployment.yaml", "service.yaml", "hpa.yaml"])
def test_manifests_match_the_kubernetes_schemas(name, version):
    for document in documents(name):
        # strict: an unknown or misspelled field is an error, not ignored
        kubernetes_validate.validate(document, version, strict=True)


def test_a_misspelled_field_is_caught():
    deployment = by_kind("Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 50
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _parse_container(container: dict):
    """The container's args and environment, as the image's entrypoint parses them."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    entrypoint, cmd = dockerfile_entrypoint(REPO / "Dockerfile")
    # what `pooler serve` reads when the parser is built: the manifest's variables only
    saved = dict(os.environ)
    try:
        for name in ("HOSTNAME", "API_KEY", "VLLM_API_KEY", "PORT", "MODEL_ID"):
            os.environ.pop(name, None)
        os.environ.update(env)
        args = build_parser().parse_args(entrypoint[1:] + container.get("args", cmd))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    peer_flags.apply(args, environ={})
    return args


def test_deployment_agrees_with_pooler():
    from pooler.server.settings import ServerSettings
    from pooler.server.edges.shutdown import BACKSTOP_SECONDS

    deployment = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    args = _parse_container(container)
    (port,) = container["ports"]
    assert args.port == port["containerPort"] == 80
    assert args.host == "0.0.0.0"
    assert args.model == ["sentence-transformers/all-MiniLM-L6-v2"] and args.log_format == "json"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": port["name"]}
    # SIGTERM arrives after preStop; then --graceful-timeout, uvicorn's backstop, the exit.
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert args.graceful_timeout == ServerSettings().graceful_timeout == 30
    assert pod["terminationGracePeriodSeconds"] >= sleep + args.graceful_timeout + \
        BACKSTOP_SECONDS + 3
    assert pod["securityContext"]["runAsNonRoot"] is True
    service = by_kind("Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]


def test_autoscaler_reads_a_metric_pooler_exports():
    from pooler.server.observability.metrics import ServerMetrics

    hpa = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == by_kind("Deployment")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = {family.name for family in ServerMetrics().registry.collect()}
    assert name in exported, sorted(exported)


def test_rayservice_matches_kuberays_schema_and_pooler():
    (service,) = documents("rayservice.yaml")
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    # KubeRay's RayService v1 schema (its CRD, pruned: deploy/kubernetes/schemas/prune_crd.py)
    schema = json.loads((KUBE / "schemas" / "rayservice-v1.json").read_text())
    jsonschema.validate(service, schema)
    cluster = service["spec"]["rayClusterConfig"]
    # ... and every pod template against Kubernetes' own PodTemplateSpec
    templates = [cluster["headGroupSpec"]["template"]] + \
        [group["template"] for group in cluster["workerGroupSpecs"]]
    for template in templates:
        for version in VERSIONS:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                          "metadata": {"name": "t"}, "template": template},
                                         version, strict=True)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'ray[data,serve]=={cluster["rayVersion"]}' in pyproject
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "pooler.ray.serve:app_builder"
    assert set(app["args"]) <= {"model", "replicas", "autoscale", "num_cpus", "num_gpus",
                                "api_key", "served_model_name"}


def test_rayservice_schema_catches_a_wrong_field():
    (service,) = documents("rayservice.yaml")
    schema = json.loads((KUBE / "schemas" / "rayservice-v1.json").read_text())
    service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, schema)


def test_rayservice_args_build_the_app(monkeypatch):
    pytest.importorskip("ray.serve")
    from pooler.ray import serve as ray_serve

    calls = {}
    monkeypatch.setattr(ray_serve, "serve_app", lambda model, **kw: calls.update(model=model, **kw))
    (service,) = documents("rayservice.yaml")
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    ray_serve.app_builder(app["args"])
    assert calls["model"] == app["args"]["model"] and calls["autoscale"] == (2, 8)


def dockerfile_entrypoint(path: Path) -> tuple[list[str], list[str]]:
    text = path.read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    return entrypoint, cmd


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_start_pooler_as_teis_image_starts(name, monkeypatch):
    text = (REPO / name).read_text()
    entrypoint, cmd = dockerfile_entrypoint(REPO / name)
    assert entrypoint[:2] == ["pooler", "serve"]
    for variable in ("HOSTNAME", "PORT", "MODEL_ID", "API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    env = dict(re.findall(r"^\s+(\w+)=(\S+)", text, re.M))
    assert env["HF_HOME"] == env["HF_HUB_CACHE"] == "/data" and env["PORT"] == "80"
    monkeypatch.setenv("PORT", env["PORT"])
    # TEI's way of starting it: `docker run IMAGE --model-id M`, or MODEL_ID alone
    for argv in (cmd, ["--model-id", "BAAI/bge-small-en-v1.5", "--max-client-batch-size", "64"]):
        args = build_parser().parse_args(entrypoint[1:] + argv)
        peer_flags.apply(args, environ={})
        assert (args.host, args.port) == ("0.0.0.0", 80)
    assert re.search(r"^EXPOSE 80$", text, re.M) and re.search(r"^VOLUME /data$", text, re.M)
    user = re.search(r"^USER (\S+)$", text, re.M).group(1)
    assert not user.startswith("0") and user != "root"
    assert "/health" in re.search(r"^HEALTHCHECK .*(?:\n\s+.*)*", text, re.M).group(0)
    assert "deploy/install.sh /opt/pooler" in text


def test_install_script_pins_the_torch_constraints_pin():
    script = (REPO / "deploy" / "install.sh").read_text()
    pins = re.findall(r"torch==([\d.]+)", script)
    (constraint,) = re.findall(r"^torch==([\d.]+)$", (REPO / "constraints.txt").read_text(),
                               re.M)
    assert pins and set(pins) == {constraint}
