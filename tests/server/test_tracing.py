"""--otlp-endpoint: spans reach an OTLP receiver on 127.0.0.1 (a gRPC TraceService built on
opentelemetry-proto's messages, in the test), nest (tokenize, queue and inference under the
request's span) and carry the caller's trace id from its W3C traceparent header."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent import futures

import httpx
import pytest

from pooler.server.settings import ServerSettings

grpc = pytest.importorskip("grpc")
pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1 import (  # noqa: E402
    trace_service_pb2, trace_service_pb2_grpc)

CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with its service name."""

    def __init__(self):
        self.spans = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (the proto's name)
        with self.lock:
            for resource_spans in request.resource_spans:
                service = {a.key: a.value.string_value
                           for a in resource_spans.resource.attributes}.get("service.name")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((service, span))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def collector():
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, f"http://127.0.0.1:{port}"
    server.stop(None)


def spans_of(sink, trace_id: str, count: int, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sink.lock:
            found = [(svc, s) for svc, s in sink.spans if s.trace_id.hex() == trace_id]
        if len(found) >= count:
            return found
        time.sleep(0.05)
    return found


def test_spans_arrive_nest_and_carry_the_callers_trace(engine, serve_app, collector):
    sink, endpoint = collector
    settings = ServerSettings(otlp_endpoint=endpoint, otlp_service_name="pooler-test")
    with serve_app(engine, settings) as (url, app):
        traceparent = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"
        r = httpx.post(f"{url}/embed", json={"inputs": ["traced text", "and another"]},
                       headers={"traceparent": traceparent}, timeout=60)
        assert r.status_code == 200
        # A request without a header starts its own trace.
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "untraced"},
                          timeout=60).status_code == 200
        assert app.state.tracer.force_flush()
        found = spans_of(sink, CALLER_TRACE_ID, 4)
    by_name = {s.name: s for _, s in found}
    assert set(by_name) == {"POST /embed", "tokenize", "queue", "inference"}, by_name.keys()
    assert {svc for svc, _ in found} == {"pooler-test"}
    root = by_name["POST /embed"]
    assert root.parent_span_id.hex() == CALLER_SPAN_ID  # the caller's span is the parent
    assert root.kind == root.SPAN_KIND_SERVER
    for child in ("tokenize", "queue", "inference"):
        span = by_name[child]
        assert span.parent_span_id == root.span_id, child
        assert root.start_time_unix_nano <= span.start_time_unix_nano <= \
            span.end_time_unix_nano <= root.end_time_unix_nano, child
    # In order: tokenization, then the wait, then the step(s).
    assert by_name["tokenize"].end_time_unix_nano <= by_name["queue"].start_time_unix_nano + 1
    assert by_name["queue"].end_time_unix_nano <= by_name["inference"].start_time_unix_nano + 1
    attributes = {a.key: a for a in root.attributes}
    assert attributes["http.route"].value.string_value == "/embed"
    assert attributes["http.response.status_code"].value.int_value == 200
    assert attributes["pooler.inputs"].value.int_value == 2
    # The second request made a trace of its own (a fresh trace id, no remote parent).
    others = [s for _, s in sink.spans if s.name == "POST /v1/embeddings"]
    assert others and others[0].trace_id.hex() != CALLER_TRACE_ID
    assert others[0].parent_span_id == b""


def test_tracing_off_imports_nothing():
    """Off by default: building the server app imports neither the OpenTelemetry SDK nor
    grpc (FastAPI itself imports the OpenTelemetry API, which is a no-op without an SDK)."""
    code = ("import sys, pooler.server.app, pooler.cli.main as m; m.build_parser(); "
            "print(sorted(n for n in ('opentelemetry.sdk', 'grpc') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_bad_endpoint_is_a_clear_error(engine):
    from pooler.server.app import create_app

    with pytest.raises(ValueError, match="--otlp-endpoint must be a URL"):
        create_app(engine, ServerSettings(otlp_endpoint="localhost:4317"), owns_engine=False)


def test_grpc_calls_join_the_callers_trace_from_metadata(engine, serve_app, collector):
    from pooler.server.grpc.generated import tei_pb2 as pb, tei_pb2_grpc as pb_grpc

    sink, endpoint = collector
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    settings = ServerSettings(otlp_endpoint=endpoint, grpc_port=0)
    with serve_app(engine, settings) as (url, app):
        with grpc.insecure_channel(f"127.0.0.1:{app.state.grpc_port}") as channel:
            pb_grpc.EmbedStub(channel).Embed(
                pb.EmbedRequest(inputs="traced over grpc"),
                metadata=[("traceparent", f"00-{trace_id}-b7ad6b7169203331-01")])
        assert app.state.tracer.force_flush()
        found = spans_of(sink, trace_id, 4)
    by_name = {s.name: s for _, s in found}
    assert set(by_name) == {"tei.v1.Embed/Embed", "tokenize", "queue", "inference"}
    root = by_name["tei.v1.Embed/Embed"]
    assert root.parent_span_id.hex() == "b7ad6b7169203331"
    assert {a.key: a.value.string_value for a in root.attributes}["rpc.system"] == "grpc"
    assert all(by_name[c].parent_span_id == root.span_id
               for c in ("tokenize", "queue", "inference"))
