"""`--log-format json`: one JSON object per line, as TEI's `--json-output` writes them
(timestamp, level, message, target, filename, line_number), for every log record of the
process (pooler's, uvicorn's, libraries'), plus one record per request from `log_request`:
request_id (the client's x-request-id, else a fresh one), method, route, status, inputs,
tokens and the durations in seconds (total_time, tokenization_time, queue_time,
inference_time: the last two the means over the request's inputs, as TEI reports them), the
gRPC method for gRPC calls, and trace_id when the caller sent a traceparent. Health probes and
scrapes (/health, /ping, /metrics) are not logged.
"""
from __future__ import annotations

import json
import logging
import sys
import uuid
from datetime import datetime, timezone

from pooler.server.observability.metrics import FinishedRequest

request_logger = logging.getLogger("pooler.request")

_PROBES = frozenset({"/health", "/ping", "/metrics"})
# Attributes every LogRecord has: anything else on a record is an `extra` field to write.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime",
                                                              "taskName"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"timestamp": datetime.fromtimestamp(record.created, timezone.utc)
                 .isoformat(timespec="microseconds").replace("+00:00", "Z"),
                 "level": record.levelname, "message": record.getMessage(),
                 "target": record.name, "filename": record.pathname,
                 "line_number": record.lineno}
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False, separators=(",", ":"))


def configure(level: str) -> None:
    """Every record of the process as a JSON line on stdout (uvicorn's too: run it with
    log_config=None so its loggers reach the root handler)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def log_request(done: FinishedRequest) -> None:
    """One INFO record per request (a ServerMetrics request observer)."""
    if done.route in _PROBES or done.scope.get("path") in _PROBES:
        return
    fields = {"request_id": _header(done.scope, b"x-request-id") or uuid.uuid4().hex,
              "method": done.method, "route": done.route, "status": done.status,
              "total_time": round(done.seconds, 6)}
    grpc_method = done.scope.get("pooler.grpc_method")
    if grpc_method:
        fields["grpc_method"] = grpc_method
    traceparent = _header(done.scope, b"traceparent")
    if traceparent and traceparent.count("-") == 3:
        fields["trace_id"] = traceparent.split("-")[1]
    if done.num_items is not None:
        fields["inputs"] = done.num_items
    call = done.call
    if call is not None:
        timed = [o.timing for o in call.finished if o.timing is not None]
        fields["tokens"] = sum(o.num_tokens for o in call.finished)
        fields["tokenization_time"] = round(call.tokenize_seconds, 6)
        if timed:
            fields["queue_time"] = round(sum(t.queue_seconds for t in timed) / len(timed), 6)
            fields["inference_time"] = round(
                sum(t.inference_seconds for t in timed) / len(timed), 6)
    summary = f"{grpc_method} {done.status}" if grpc_method else \
        f"{done.method} {done.route} {done.status}"
    request_logger.info("%s", summary, extra=fields)
