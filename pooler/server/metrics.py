"""Prometheus metrics (prometheus-client), one registry per app so tests can run several.

Per route: request counts and latency by status. Per engine step: requests and tokens in the
batch, and its inference time. Per request: tokenization time and time queued in the engine.
"""
from __future__ import annotations

import time

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
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

    # ---- engine loop listeners (called from the loop thread) ----------------------------
    def on_step(self, num_requests: int, num_tokens: int, seconds: float) -> None:
        self.batch_requests.observe(num_requests)
        self.batch_tokens.observe(num_tokens)
        self.inference_time.observe(seconds)

    def on_queued(self, seconds: float) -> None:
        self.queue_time.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware): counts every HTTP response by route template."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            # Route templates only: raw paths of 404s would let clients grow the label set.
            label = getattr(route, "path", None) or "unmatched"
            labels = (scope["method"], label, str(status["code"]))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - start)
