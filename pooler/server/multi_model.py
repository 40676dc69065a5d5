"""Several models in one server: one full pooler app (engine, queue, worker threads, limits)
per model, behind a small ASGI router that picks the app by the request's `model`.

A typical RAG stack (an embedder, a reranker, a NER model) runs in one process, and one
model's overload or failure cannot stall the others: each app has its own engine loop,
admission queue and executor. A request that names no model (TEI-style clients) goes to the
first model that serves its route's task. `/v1/models`, `/info`, `/health` and `/metrics`
answer for every model (`/metrics` carries a `model` label on every sample).
"""
from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pooler.server.asgi_call import call_asgi
from pooler.server.observability.peer_metrics import render_text

# The task a route serves, for requests that name no model (the first model with it wins).
_ROUTE_TASKS = {
    "/v1/embeddings": ("embed",), "/embeddings": ("embed",), "/embed": ("embed",),
    "/v2/embed": ("embed",), "/embed_all": ("token_embed", "embed"),
    "/embed_sparse": ("embed",), "/embed_chunks": ("token_embed",),
    "/classify": ("classify",), "/predict": ("classify",),
    "/rerank": ("classify", "token_embed", "embed"),
    "/v1/rerank": ("classify", "token_embed", "embed"),
    "/v2/rerank": ("classify", "token_embed", "embed"),
    "/score": ("classify", "token_embed", "embed"),
    "/v1/score": ("classify", "token_embed", "embed"),
    "/similarity": ("embed",), "/ner": ("token_classify",),
}
_AGGREGATED = {"/v1/models", "/info", "/health", "/metrics"}


@dataclass
class ServedModel:
    name: str
    app: object  # the FastAPI app create_app built for this model's engine
    memory_mb: float | None = None  # resident memory the model added at load


class ModelRouter:
    """ASGI app: routes each request to one model's app."""

    def __init__(self, models: list[ServedModel], api_key: str | None = None,
                 max_body_bytes: int = 32 * 2**20):
        if not models:
            raise ValueError("serve at least one model.")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"served model names must be unique, got {names}; set a "
                             "distinct name for each (--served-model-name / `name`).")
        self.models = models
        self.by_name = {}
        for m in models:
            state = m.app.state.pooler
            for alias in state.model_names:
                self.by_name.setdefault(alias, m)
            self.by_name[m.name] = m
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    # ---- ASGI ---------------------------------------------------------------------------
    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:  # websockets: none served
            await send({"type": "websocket.close", "code": 1000})

    async def _lifespan(self, receive, send):
        stack = AsyncExitStack()
        message = await receive()
        try:
            for m in self.models:  # each app's own lifespan: starts its engine loop
                await stack.enter_async_context(m.app.router.lifespan_context(m.app))
        except Exception as exc:
            await stack.aclose()
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        if message["type"] == "lifespan.shutdown":
            await stack.aclose()
            await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope, receive, send):
        path = scope["path"]
        if path in _AGGREGATED and scope["method"] == "GET":
            if path != "/health" and not self._authorized(scope):
                return await _json(send, 401, _error(
                    "Missing or invalid API key: send 'Authorization: Bearer KEY'.",
                    "authentication_error", None, "invalid_api_key"))
            return await getattr(self, "_" + path.strip("/").replace("/", "_"))(scope, send)
        body, more = b"", True
        length = dict(scope.get("headers") or {}).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            # Too large to look inside: the default app answers it (413).
            return await self.models[0].app(scope, receive, send)
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        target = self._pick(path, body)
        if target is None:
            name = _model_field(body)
            return await _json(send, 404, _error(
                f"The model '{name}' does not exist on this server; it serves "
                f"{[m.name for m in self.models]}.", "invalid_request_error", "model",
                "model_not_found"))
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()
        await target.app(scope, replay, send)

    @property
    def shutdown_gate(self) -> "_AllGates":
        """Every model's shutdown gate as one (GracefulServer begins and expires it)."""
        return _AllGates([m.app.state.pooler.shutdown for m in self.models])

    def _pick(self, path: str, body: bytes) -> ServedModel | None:
        name = _model_field(body)
        if name is not None:
            if name in self.by_name:
                return self.by_name[name]
            # A LoRA adapter (loadable at run time) goes to the model that serves it.
            return next((m for m in self.models
                         if name in m.app.state.pooler.lora_names), None)
        for task in _ROUTE_TASKS.get(path, ()):
            for m in self.models:
                if task in m.app.state.pooler.engine.supported_tasks:
                    return m
        return self.models[0]

    def _authorized(self, scope) -> bool:
        if not self.api_key:
            return True
        header = dict(scope.get("headers") or {}).get(b"authorization", b"").decode()
        return header == f"Bearer {self.api_key}"

    # ---- answers for every model ----------------------------------------------------------
    async def _v1_models(self, scope, send):
        data = []
        for m in self.models:
            _, body = await _asgi_get(m.app, "/v1/models", scope)
            data += json.loads(body).get("data", [])
        await _json(send, 200, {"object": "list", "data": data})

    async def _info(self, scope, send):
        infos = []
        for m in self.models:
            _, body = await _asgi_get(m.app, "/info", scope)
            info = json.loads(body)
            info["memory_mb"] = m.memory_mb
            infos.append(info)
        # TEI clients read one model's fields: the first model's, plus the list of all.
        await _json(send, 200, {**infos[0], "models": infos})

    async def _health(self, scope, send):
        statuses = {}
        for m in self.models:
            status, _ = await _asgi_get(m.app, "/health", scope)
            statuses[m.name] = "ok" if status == 200 else "unavailable"
        healthy = all(s == "ok" for s in statuses.values())
        await _json(send, 200 if healthy else 503,
                    {"status": "ok" if healthy else "unavailable", "models": statuses})

    async def _metrics(self, scope, send):
        merged: dict[str, Metric] = {}
        for m in self.models:
            _, body = await _asgi_get(m.app, "/metrics", scope)
            for family in text_string_to_metric_families(body.decode()):
                target = merged.setdefault(family.name, Metric(
                    family.name, family.documentation, family.type, family.unit))
                for sample in family.samples:
                    target.add_sample(sample.name, {**sample.labels, "model": m.name},
                                      sample.value, sample.timestamp, sample.exemplar)
        registry = CollectorRegistry()
        registry.register(_Families(list(merged.values())))
        body = render_text(registry)  # TEI's counters keep their names (no _total)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]})
        await send({"type": "http.response.body", "body": body})


class _AllGates:
    def __init__(self, gates):
        self.gates = gates

    def begin(self) -> None:
        for gate in self.gates:
            gate.begin()

    def expire(self) -> None:
        for gate in self.gates:
            gate.expire()


def resident_mb() -> float:
    """This process's resident memory in MB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    import os
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def _model_field(body: bytes) -> str | None:
    try:
        payload = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None  # the model's app reports the JSON error itself
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) else None


def _error(message: str, kind: str, param: str | None, code: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _asgi_get(app, path: str, scope) -> tuple[int, bytes]:
    """GET `path` on one model's app in process (its own auth and handlers run)."""
    inner = {**scope, "path": path, "raw_path": path.encode(), "query_string": b"",
             "method": "GET"}
    return await call_asgi(app, inner)
