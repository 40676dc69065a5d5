"""Prometheus metrics (prometheus-client), one registry per app so tests can run several.

Per route: request counts and latency by status (a client that went away before its answer is
status 499, never a 5xx). Per engine step: requests and tokens in the batch, and its
inference time. Per request: tokenization time and time queued in the engine.

Gauges read at each scrape (`observe_engine`), for operators and for admission control:
- pooler_engine_requests_waiting / _running, pooler_engine_tokens_waiting / _running: the
  engine scheduler's queue;
- pooler_late_interaction_cached_queries, _pending_docs, _cached_bytes: the ColBERT query
  cache (queries cached for documents still to score, documents registered and not yet
  scored, bytes of cached query vectors). Zero when idle: anything else is a leak.
- pooler_image_cache_* {cache="mm"|"encoder"}: an image-text model's two caches
  (Engine.image_cache_stats()): hits, misses and evictions since start, entries, bytes held and
  the byte bound; the multimodal input cache holds preprocessed pixels, the encoder cache
  vision-tower outputs. Absent for text models.
Connections (see edges/connection_limits.py): open connections, connections refused at the cap,
clients cut for sending headers or body too slowly.

TEI's and vLLM's names live in the same registry (peer_metrics.py). Every finished HTTP request
goes, as a `FinishedRequest`, to the `request_observers` (those names, the tracer, the JSON
request log): with none registered, nothing is built.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pooler.server.errors import CLIENT_CLOSED_REQUEST
from pooler.server.observability.peer_metrics import PeerMetrics, is_inference_route, render_text

logger = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass
class FinishedRequest:
    """One answered HTTP request, as the observers see it."""
    scope: dict[str, Any]   # the ASGI scope: headers, route, and what respond() left there
    method: str
    route: str              # the route template ("unmatched" for unknown paths)
    status: int
    started_ns: int         # time.time_ns() on arrival (for spans)
    started_monotonic: float  # time.monotonic() on arrival (the engine timings' clock)
    seconds: float          # arrival to the last byte of the answer

    @property
    def call(self):
        """The engine CallContext of the request (None: it never reached the engine)."""
        return self.scope.get("pooler.call")

    @property
    def num_items(self) -> int | None:
        return self.scope.get("pooler.num_items")

    def wall_ns(self, monotonic: float) -> int:
        """An engine timestamp (time.monotonic()) as time.time_ns()."""
        return self.started_ns + int((monotonic - self.started_monotonic) * 1e9)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.peer: PeerMetrics | None = None
        self.request_observers: list[Callable[[FinishedRequest], None]] = []
        r = self.registry
        self.requests = Counter("pooler_http_requests", "HTTP requests by route and status",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("pooler_http_request_duration_seconds",
                                 "HTTP request latency by route and status",
                                 ["method", "route", "status"], buckets=_LATENCY_BUCKETS,
                                 registry=r)
        self.queue_size = Gauge("pooler_queue_size",
                                "requests waiting in the engine scheduler", registry=r)
        self.inputs_in_flight = Gauge("pooler_inputs_in_flight",
                                      "inputs admitted by the server and not yet answered",
                                      registry=r)
        self.batch_requests = Histogram("pooler_batch_requests", "requests per engine step",
                                        buckets=_COUNT_BUCKETS, registry=r)
        self.batch_tokens = Histogram("pooler_batch_tokens", "tokens per engine step",
                                      buckets=_TOKEN_BUCKETS, registry=r)
        self.inference_time = Histogram("pooler_inference_seconds",
                                        "time of one engine step (forward pass + pooling)",
                                        buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("pooler_queue_seconds",
                                    "time a request waited in the engine before its step",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.tokenize_time = Histogram("pooler_tokenize_seconds",
                                       "tokenization time of one HTTP request",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        # The engine's queue (scheduler), read at scrape time.
        self.engine_requests_waiting = Gauge(
            "pooler_engine_requests_waiting", "requests queued in the engine scheduler",
            registry=r)
        self.engine_requests_running = Gauge(
            "pooler_engine_requests_running", "requests in the engine step being computed",
            registry=r)
        self.engine_tokens_waiting = Gauge(
            "pooler_engine_tokens_waiting", "tokens of the requests queued in the engine",
            registry=r)
        self.engine_tokens_running = Gauge(
            "pooler_engine_tokens_running", "tokens of the engine step being computed",
            registry=r)
        # The late-interaction (ColBERT) query cache, read at scrape time.
        self.li_cached_queries = Gauge(
            "pooler_late_interaction_cached_queries",
            "ColBERT queries cached for documents still to score", registry=r)
        self.li_pending_docs = Gauge(
            "pooler_late_interaction_pending_docs",
            "ColBERT documents registered with the model runner and not yet scored",
            registry=r)
        self.li_cached_bytes = Gauge(
            "pooler_late_interaction_cached_bytes",
            "bytes of cached ColBERT query vectors", registry=r)
        # Connections (pooler/server/edges/connection_limits.py).
        self.connections_open = Gauge("pooler_http_connections_open",
                                      "open client connections", registry=r)
        self.connections_rejected = Counter(
            "pooler_http_connections_rejected",
            "connections closed at once because --max-connections were open", registry=r)
        self.client_timeouts = Counter(
            "pooler_http_client_timeouts",
            "connections cut because the client sent its request too slowly "
            "(phase: headers or body)", ["phase"], registry=r)
        self.draining = Gauge("pooler_server_draining",
                              "1 while the server shuts down (stopped accepting work)",
                              registry=r)

    def add_image_cache_metrics(self, read_stats: Callable[[], dict | None]) -> None:
        """Export an image-text model's caches; `read_stats` is Engine.image_cache_stats."""
        self.registry.register(ImageCacheCollector(read_stats))

    def add_peer_metrics(self, model_name: str, max_model_len: int) -> PeerMetrics:
        """Register TEI's and vLLM's names (once) and count inference requests under them."""
        if self.peer is None:
            self.peer = PeerMetrics(self.registry, model_name, max_model_len)
            self.request_observers.append(self._count_peer_request)
        return self.peer

    def _count_peer_request(self, done: FinishedRequest) -> None:
        # 401s never reach a handler (TEI checks the key before its routes count anything).
        if done.status != 401 and is_inference_route(done.method, done.route):
            self.peer.on_request(done.status, done.seconds, done.call, done.num_items)

    def finish(self, done: FinishedRequest) -> None:
        for observer in self.request_observers:
            try:
                observer(done)
            except Exception:  # metrics, traces and logs never break an answer
                logger.exception("request observer %r failed", observer)

    # ---- engine loop listeners (called from the loop thread) ----------------------------
    def on_step(self, num_requests: int, num_tokens: int, seconds: float) -> None:
        self.batch_requests.observe(num_requests)
        self.batch_tokens.observe(num_tokens)
        self.inference_time.observe(seconds)
        if self.peer is not None:
            self.peer.on_step(num_requests, num_tokens, seconds)

    def on_finished(self, output) -> None:
        if self.peer is not None:
            self.peer.on_finished(output)

    def on_queued(self, seconds: float) -> None:
        self.queue_time.observe(seconds)

    def observe_engine(self, engine) -> None:
        """Set the engine-queue and late-interaction gauges from the engine (any thread:
        the readings are copies or plain counters)."""
        stats = engine.core.scheduler.queue_stats()
        self.queue_size.set(stats.waiting)
        self.engine_requests_waiting.set(stats.waiting)
        self.engine_requests_running.set(stats.running)
        self.engine_tokens_waiting.set(stats.waiting_tokens)
        self.engine_tokens_running.set(stats.running_tokens)
        if self.peer is not None:
            self.peer.observe_queue(stats.waiting, stats.running)
        pooling_runner = getattr(engine.core.model_runner, "pooling_runner", None)
        cache = getattr(pooling_runner, "late_interaction", None)
        if cache is not None:  # the transformers fallback runner has no ColBERT cache
            self.li_cached_queries.set(cache.num_cached_queries)
            self.li_pending_docs.set(cache.num_pending_docs)
            self.li_cached_bytes.set(cache.cached_bytes)

    def render(self) -> tuple[bytes, str]:
        return render_text(self.registry), CONTENT_TYPE_LATEST


class ImageCacheCollector(Collector):
    """The multimodal input cache's and the encoder cache's counters, read at each scrape
    (they count inside the engine: totals since start, never reset by a cache reset)."""

    _COUNTERS = (("hits", "lookups that found their entry"),
                 ("misses", "lookups that did not"),
                 ("evictions", "entries dropped to stay within the byte bound"))
    _GAUGES = (("entries", "entries held"), ("bytes", "bytes held"),
               ("capacity_bytes", "the byte bound"))

    def __init__(self, read_stats: Callable[[], dict | None]):
        self._read = read_stats

    def describe(self):
        return []  # read at scrape time only: nothing to check at registration

    def collect(self):
        stats = self._read() or {}
        what = {"mm": "multimodal input cache (preprocessed images)",
                "encoder": "encoder cache (vision-tower outputs)"}
        families = []
        for name, doc in self._COUNTERS:
            family = CounterMetricFamily(f"pooler_image_cache_{name}",
                                         f"image caches: {doc} ({', '.join(what.values())})",
                                         labels=["cache"])
            for cache, s in stats.items():
                if s is not None:  # no encoder cache where transformers runs the tower
                    family.add_metric([cache], getattr(s, name))
            families.append(family)
        for name, doc in self._GAUGES:
            family = GaugeMetricFamily(f"pooler_image_cache_{name}", f"image caches: {doc}",
                                       labels=["cache"])
            for cache, s in stats.items():
                if s is not None:
                    family.add_metric([cache], getattr(s, name))
            families.append(family)
        return families


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware): counts every HTTP response by route template."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        started_ns, started_monotonic = time.time_ns(), time.monotonic()
        status = {"code": None}
        client_left = False

        async def receive_wrapper():
            nonlocal client_left
            message = await receive()
            if message["type"] == "http.disconnect":
                client_left = True
            return message

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            if status["code"] is None:
                # No answer was sent: the client left (e.g. mid-body) is 499, not a server
                # error; no answer for any other reason is the web server's 500.
                status["code"] = CLIENT_CLOSED_REQUEST if client_left else 500
            label = _route_label(scope)
            labels = (scope["method"], label, str(status["code"]))
            seconds = time.perf_counter() - start
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(seconds)
            if self.metrics.request_observers:
                self.metrics.finish(FinishedRequest(
                    scope, scope["method"], label, status["code"], started_ns,
                    started_monotonic, seconds))


def _route_label(scope) -> str:
    """The route template of a request. Route templates only: raw paths of 404s would let
    clients grow the label set. A request that ended before routing (e.g. the client left
    mid-body) still counts under its route when its path is one of the app's (static)
    route paths."""
    path = getattr(scope.get("route"), "path", None)
    if path:
        return path
    app = scope.get("app")
    known = getattr(app, "_pooler_route_paths", None)
    if known is None and app is not None:
        try:
            known = frozenset(app.openapi().get("paths", {}))
        except Exception:  # never let metrics break a response
            known = frozenset()
        app._pooler_route_paths = known
    return scope["path"] if known and scope.get("path") in known else "unmatched"


def serve_metrics_port(host: str, port: int, scrape: Callable[[], tuple[bytes, str]]):
    """`--prometheus-port`: GET /metrics (any path, as TEI's listener) on a port of its own, in a
    daemon thread, so a scraper needs no API key and never queues behind inference traffic.
    Returns the server (call .shutdown() to stop it)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body, content_type = scrape()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes every few seconds: keep them out of the logs
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="pooler-metrics-port",
                     daemon=True).start()
    return server
