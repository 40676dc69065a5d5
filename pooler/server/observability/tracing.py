"""OpenTelemetry traces over OTLP (`--otlp-endpoint`, `--otlp-service-name`), as TEI exports
them: one span per request, with children for tokenization, the wait in the engine's queue and
the inference, in the caller's trace when it sends a W3C `traceparent` header (gRPC: metadata).

The spans are written when the answer has gone out, from the timings the request already
collects for the metrics (the call's tokenization time and each engine request's submit /
step-start / step-end times), so no tracing code runs on the request's path. Off (the
default), this module is never imported: no SDK, no spans, no cost.

The endpoint: `http(s)://host:port` exports OTLP over gRPC (TEI's transport, the collector's
port 4317); a URL ending in `/v1/traces` exports OTLP over HTTP/protobuf (port 4318).
GET requests (health checks, scrapes, /info) are not traced.
"""
from __future__ import annotations

from pooler.install_hint import install_command
from pooler.server.observability.metrics import FinishedRequest



def _exporter(endpoint: str):
    try:
        if endpoint.rstrip("/").endswith("/v1/traces"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter(endpoint=endpoint)
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ValueError(f"--otlp-endpoint needs the OpenTelemetry SDK and OTLP exporters: "
                         f"{install_command('ops')} ({exc}).") from None
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"--otlp-endpoint must be a URL such as http://127.0.0.1:4317 (OTLP "
                         f"over gRPC) or http://127.0.0.1:4318/v1/traces (OTLP over HTTP), "
                         f"got {endpoint!r}.")
    return OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))


class RequestTracer:
    """Turns each finished request into spans (a `request_observers` entry of ServerMetrics).
    Its own TracerProvider (not the global one), so several apps in one process keep their
    own service names and exporters."""

    def __init__(self, endpoint: str, service_name: str, model_name: str):
        exporter = _exporter(endpoint)
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("pooler.server")
        self._propagator = TraceContextTextMapPropagator()
        self._server_kind, self._internal_kind = SpanKind.SERVER, SpanKind.INTERNAL
        self._error_status = Status(StatusCode.ERROR)
        self._in_span = set_span_in_context
        self._model = model_name

    def on_request(self, done: FinishedRequest) -> None:
        if done.method == "GET":
            return
        headers = {}
        for name, value in done.scope.get("headers", ()):
            if name in (b"traceparent", b"tracestate"):
                headers[name.decode()] = value.decode("latin-1")
        parent = self._propagator.extract(headers)  # an invalid header starts a new trace
        grpc_method = done.scope.get("pooler.grpc_method")
        name = grpc_method or f"{done.method} {done.route}"
        attributes = {"pooler.model": self._model}
        if grpc_method:
            service, _, method = grpc_method.rpartition("/")
            attributes.update({"rpc.system": "grpc", "rpc.service": service,
                               "rpc.method": method})
        else:
            attributes.update({"http.request.method": done.method, "http.route": done.route,
                               "http.response.status_code": done.status})
        call = done.call
        if done.num_items is not None:
            attributes["pooler.inputs"] = done.num_items
        timed = [o.timing for o in call.finished if o.timing is not None] if call else []
        if timed:
            attributes["pooler.tokens"] = sum(o.num_tokens for o in call.finished)
        end_ns = done.started_ns + int(done.seconds * 1e9)
        span = self._tracer.start_span(name, context=parent, kind=self._server_kind,
                                       attributes=attributes, start_time=done.started_ns)
        if done.status >= 500:
            span.set_status(self._error_status)
        if timed:
            inside = self._in_span(span)
            submitted = min(t.submitted for t in timed)
            started = min(t.started for t in timed)
            finished = max(t.finished for t in timed)
            steps = len({t.started for t in timed})
            # Tokenization ends where the first engine request is built (Request.arrival_time).
            self._child("tokenize", inside, done.wall_ns(submitted - call.tokenize_seconds),
                        done.wall_ns(submitted), {"pooler.seconds": call.tokenize_seconds})
            self._child("queue", inside, done.wall_ns(submitted), done.wall_ns(started),
                        {"pooler.requests": len(timed)})
            self._child("inference", inside, done.wall_ns(started), done.wall_ns(finished),
                        {"pooler.requests": len(timed), "pooler.engine_steps": steps})
        span.end(end_time=end_ns)

    def _child(self, name: str, context, start_ns: int, end_ns: int, attributes: dict):
        child = self._tracer.start_span(name, context=context, kind=self._internal_kind,
                                        attributes=attributes, start_time=start_ns)
        child.end(end_time=max(start_ns, end_ns))

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        return self._provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self._provider.shutdown()
