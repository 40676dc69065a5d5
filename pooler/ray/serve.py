"""`pooler serve --ray`: the same FastAPI app as `pooler serve`, as a Ray Serve deployment.

Each replica is a Ray actor that builds one Engine and then the app of pooler/server/app.py
around it (`serve.ingress()` in its late-bound form: `__serve_build_asgi_app__` runs on the
replica after the constructor), so every route, error and limit is the one `pooler serve` has;
there is no second copy of the routes. Serve runs the app's lifespan, which starts the engine's
background loop (continuous batching inside each replica).

- Routing: Serve's proxy sends each HTTP request, whole, to one replica. A ColBERT score or
  rerank runs both of its stages (query into the late-interaction cache, then the documents'
  MaxSim) inside that replica's Engine, in that one handler call: the two stages are never
  separate requests, so they can never land on different replicas. If the replica dies, its
  cache dies with it and the client gets an error from the proxy: a 5xx, or in one race
  inside Serve (a retried request whose body the dead replica had read) a 408 at Serve's
  request timeout or the app's body timeout, whichever is first (docs/scale-out.md).
- Scaling: a fixed number of replicas, or autoscaling between MIN and MAX on ongoing requests
  per replica (Serve's `target_ongoing_requests`).
- Metrics: `/metrics` answers with the Prometheus registry of the replica that served the
  request; every response carries `x-pooler-replica` (the Serve replica id) to tell them apart.
  Ray's own per-replica metrics (queue length, latency) are on each node's Ray metrics port.

    serve run pooler.ray.serve:app_builder model=sentence-transformers/all-MiniLM-L6-v2 replicas=2
"""
from __future__ import annotations

from typing import Any

from ray import serve

from pooler.server.settings import ServerSettings

REPLICA_HEADER = "x-pooler-replica"


@serve.ingress()
class PoolerDeployment:
    """One replica: one Engine, one `pooler serve` app."""

    def __init__(self, engine_kwargs: dict[str, Any], settings: dict[str, Any]):
        from pooler.engine.llm import Engine

        kwargs = dict(engine_kwargs)
        self.engine = Engine(kwargs.pop("model"), **kwargs)
        self.settings = ServerSettings(**settings)

    def __serve_build_asgi_app__(self):
        from pooler.server.app import create_app

        app = create_app(self.engine, self.settings)
        app.add_middleware(_ReplicaHeader, replica=_replica_id())
        return app


class _ReplicaHeader:
    """Pure ASGI: adds the replica id to every response."""

    def __init__(self, app, replica: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (tests building the app directly)
        return "local"


def serve_app(model: str, *, replicas: int = 1, autoscale: tuple[int, int] | None = None,
              target_ongoing_requests: float = 16, max_ongoing_requests: int = 64,
              num_cpus: float = 1.0, num_gpus: float = 0.0,
              engine_kwargs: dict[str, Any] | None = None,
              settings: ServerSettings | dict[str, Any] | None = None):
    """A Ray Serve application serving `model` with `pooler serve`'s routes.

    replicas: a fixed count, or autoscale=(min, max) on ongoing requests per replica.
    num_cpus / num_gpus: reserved per replica; on CPU the engine uses num_cpus threads unless
    engine_kwargs sets num_threads. Run it with `serve.run(serve_app(...))`."""
    kwargs = {"model": model, **{k: v for k, v in (engine_kwargs or {}).items()
                                 if v is not None and k != "model"}}
    if num_gpus:
        kwargs.setdefault("device", "cuda")
    else:
        kwargs.setdefault("num_threads", max(1, int(num_cpus)))
    if isinstance(settings, ServerSettings):
        settings = vars(settings).copy()
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max_ongoing_requests,
        # A replica that stops answering health checks is replaced.
        "health_check_period_s": 5, "health_check_timeout_s": 30}
    if autoscale is not None:
        low, high = autoscale
        if not 0 <= low <= high or high < 1:
            raise ValueError(f"--autoscale MIN,MAX needs 0 <= MIN <= MAX and MAX >= 1, got "
                             f"{low},{high}.")
        options["autoscaling_config"] = {"min_replicas": low, "max_replicas": high,
                                         "initial_replicas": max(low, 1),
                                         "target_ongoing_requests": target_ongoing_requests}
    else:
        if replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {replicas}.")
        options["num_replicas"] = replicas
    deployment = serve.deployment(PoolerDeployment, name="pooler").options(**options)
    return deployment.bind(kwargs, settings or {})


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        low, high = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--autoscale takes MIN,MAX (e.g. 1,4), got {text!r}.") from None
    return low, high


def app_builder(args: dict[str, str]):
    """For `serve run pooler.ray.serve:app_builder model=M [replicas=N | autoscale=MIN,MAX]
    [num_cpus=C] [num_gpus=G] [api_key=KEY]`."""
    known = {"model", "replicas", "autoscale", "num_cpus", "num_gpus", "api_key",
             "served_model_name"}
    unknown = set(args) - known
    if unknown or "model" not in args:
        raise ValueError(f"app_builder takes model=M and optionally {sorted(known - {'model'})}"
                         f"; got {sorted(args)}.")
    settings = {k: args[k] for k in ("api_key", "served_model_name") if k in args}
    return serve_app(args["model"], replicas=int(args.get("replicas", 1)),
                     autoscale=parse_autoscale(args.get("autoscale")),
                     num_cpus=float(args.get("num_cpus", 1)),
                     num_gpus=float(args.get("num_gpus", 0)), settings=settings)


def run_serve(app, *, host: str, port: int, address: str | None = None,
              request_timeout_s: float | None = 300, replicas: int = 1,
              num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
    """Start Serve's HTTP proxy on host:port and run `app` until interrupted.

    address: the cluster to join; None starts a local Ray on this machine. replicas /
    num_cpus / num_gpus: what `app` starts with, checked against the cluster first: Serve
    would otherwise wait forever for replicas that cannot be placed."""
    import ray

    from pooler.ray.resources import cluster_nodes, plan_actors

    ray.init(address=address or "local", ignore_reinit_error=True, include_dashboard=False)
    try:
        # Serve's controller and proxies ask no CPU: the replicas may take them all.
        plan_actors(*cluster_nodes(), replicas=replicas, num_cpus=num_cpus, num_gpus=num_gpus,
                    task_room=0)
    except ValueError:
        ray.shutdown()
        raise
    serve.start(http_options={"host": host, "port": port,
                              "request_timeout_s": request_timeout_s})
    try:
        serve.run(app, name="pooler", route_prefix="/", blocking=True)
    except KeyboardInterrupt:  # Ctrl-C: take the app down, leave no replicas behind
        serve.delete("pooler")
    finally:
        ray.shutdown()
