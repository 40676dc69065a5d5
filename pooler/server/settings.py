"""The server's limits and names, importable without the web stack (the CLI reads their
defaults for `pooler serve --help` without importing FastAPI)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerSettings:
    served_model_name: str | None = None
    api_key: str | None = None
    max_input_items: int = 4096          # inputs in one request (413 above)
    max_payload_bytes: int = 32 * 2**20  # request body size (413 above)
    max_queue: int = 16384               # inputs admitted and unanswered (503 above)
    max_workers: int = 64                # threads running blocking Engine calls
    # The server's edges (pooler/server/edges/connection_limits.py, shutdown.py).
    graceful_timeout: float = 30.0       # s in-flight requests may finish on SIGTERM
    header_timeout: float = 10.0         # s to send a request head (408 after)
    body_timeout: float = 60.0           # s to send a whole body after its head (408 after)
    keep_alive_timeout: float = 5.0      # s an idle keep-alive connection stays open
    max_connections: int = 2048          # open connections (more are refused with 503)
    show_model_path: bool = False        # /info and /v1/models show the model's folder
    long_input: str = "truncate"         # /v1/embeddings default: "truncate" | "chunk"
    # The queue in tokens (503 above): a fixed number, or None to derive it from the measured
    # rate: tokens/s x max_queue_seconds (pooler/server/edges/limits.py, TokenAdmission).
    max_queue_tokens: int | None = None
    # 20 s: a request admitted at the bound is answered (its own compute added) before a 60 s
    # client time-out on a 2-CPU machine (figures: README, "Admission"; the bench:
    # python -m pooler.bench.burst).
    max_queue_seconds: float = 20.0
    # The steady-load floor (edges/limits.py, TokenAdmission part 2): requests of at most this many
    # inputs are admitted past the time bound while at most this many requests are in flight.
    small_request_inputs: int = 8
    small_request_slots: int = 64
    # Operating (README "Operating pooler"): /metrics on a port of its own, TEI's gRPC API,
    # OpenTelemetry traces over OTLP, one JSON log line per request. Off when None / False.
    prometheus_port: int | None = None
    grpc_port: int | None = None
    listen_host: str = "127.0.0.1"       # where those extra ports listen (the server's --host)
    otlp_endpoint: str | None = None
    otlp_service_name: str = "pooler"
    log_requests: bool = False           # one log record per request (--log-format json)
    # Images in requests (pooler/server/media.py): data: URLs always; http(s) URLs within these
    # limits, never to private/loopback/link-local hosts unless allowed; file:// URLs only under
    # allowed_local_media_path (vLLM's --allowed-local-media-path).
    max_image_bytes: int = 20 * 2**20    # encoded size of one image
    media_fetch_timeout: float = 10.0    # s to fetch one image URL, redirects included
    allow_private_media_urls: bool = False
    allowed_local_media_path: str | None = None
    media_workers: int = 8               # threads fetching and decoding images

    def __post_init__(self):
        for name in ("max_input_items", "max_payload_bytes", "max_queue", "max_workers",
                     "header_timeout", "body_timeout", "keep_alive_timeout",
                     "max_connections", "max_queue_seconds", "small_request_inputs",
                     "max_image_bytes", "media_fetch_timeout", "media_workers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        if self.max_queue_tokens is not None and self.max_queue_tokens <= 0:
            raise ValueError(f"max_queue_tokens must be positive, got {self.max_queue_tokens}.")
        if self.small_request_slots < 0:
            raise ValueError("small_request_slots must be >= 0 (0 turns the floor off), got "
                             f"{self.small_request_slots}.")
        if self.long_input not in ("truncate", "chunk"):
            raise ValueError(f"long_input must be 'truncate' or 'chunk', got {self.long_input!r}.")
        if self.graceful_timeout < 0:
            raise ValueError(f"graceful_timeout must be >= 0, got {self.graceful_timeout}.")
        if self.allowed_local_media_path is not None:
            from pathlib import Path

            if not Path(self.allowed_local_media_path).is_dir():
                raise ValueError("allowed_local_media_path must be an existing folder, got "
                                 f"{self.allowed_local_media_path!r}.")
        for name in ("prometheus_port", "grpc_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{name} must be a TCP port (0-65535), got {port}.")
        if self.grpc_port is not None:
            require_ops_extra("--grpc-port", ("grpc", "grpc_health", "grpc_reflection",
                                              "google.protobuf"))
        if self.otlp_endpoint:
            require_ops_extra("--otlp-endpoint", ("opentelemetry.sdk",
                                                  "opentelemetry.exporter.otlp.proto.grpc",
                                                  "opentelemetry.exporter.otlp.proto.http"))


def require_ops_extra(flag: str, modules: tuple[str, ...]) -> None:
    """A clear error, before any model loads, when a flag needs the `ops` extra."""
    from importlib.util import find_spec

    missing = []
    for module in modules:
        try:
            found = find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is absent
            found = False
        if not found:
            missing.append(module)
    if missing:
        from pooler.install_hint import install_command

        raise ValueError(f"{flag} needs {', '.join(missing)} (pooler's [ops] extra): "
                         f"{install_command('ops')}")
