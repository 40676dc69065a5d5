"""`pooler serve MODEL`: the HTTP server (FastAPI on uvicorn).

SIGTERM / Ctrl-C: stop accepting connections, let in-flight requests finish (up to
--graceful-timeout seconds), abort the rest (503 with Retry-After) and exit 0; a second
signal exits at once (pooler/server/edges/shutdown.py). Slow clients are bounded by
--header-timeout, --body-timeout, --keep-alive-timeout and --max-connections
(pooler/server/edges/connection_limits.py).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys

from pooler.cli import peer_flags
from pooler.cli.common import add_engine_args, engine_from_args, engine_kwargs

logger = logging.getLogger("pooler.serve")


def add_parser(sub) -> None:
    from pooler.server.settings import ServerSettings

    d = ServerSettings()
    p = sub.add_parser(
        "serve", help="serve a model over HTTP",
        description="Serve a pooling model over HTTP with OpenAI (/v1/embeddings, /v1/models), "
                    "vLLM (/pooling, /classify, /score, /rerank, /tokenize, /detokenize), "
                    "Cohere/Jina (/v1/rerank, /v2/rerank), TEI (/embed, /embed_all, /rerank, "
                    "/predict, /embed_sparse, /tokenize, /decode, /info, /health) and pooler "
                    "(/ner, /metrics) routes. OpenAPI spec at /openapi.json.")
    p.add_argument("model_arg", nargs="?", metavar="MODEL", default=None,
                   help="model folder, installed model package name, or Hugging Face hub id "
                        "ORG/NAME (same as --model)")
    add_engine_args(p, several_models=True)
    p.add_argument("--models-config", default=None, metavar="FILE.toml",
                   help="serve several models: a TOML file with one [[models]] table per model "
                        "(model = ..., optional name = ..., and any Engine option: task, "
                        "runner, dtype, max_num_batched_tokens, ...); requests pick one by "
                        "their `model` field")
    lora = p.add_argument_group("LoRA adapters (docs/models/lora.md)")
    lora.add_argument("--lora-modules", nargs="+", default=None, type=parse_lora_module,
                      metavar="NAME=PATH",
                      help="PEFT LoRA folders served beside the base model, as vLLM spells "
                           "them: NAME=PATH or '{\"name\": ..., \"path\": ...}'; a request "
                           "picks one with its `model` field")
    lora.add_argument("--enable-lora", action="store_true",
                      help="serve LoRA adapters (implied by --lora-modules); with it, "
                           "POST /v1/load_lora_adapter and /v1/unload_lora_adapter add and "
                           "remove adapters at run time")
    lora.add_argument("--max-loras", type=int, default=8,
                      help="adapters held in memory and in one batch at once; others are read "
                           "from disk again when asked for, least recently used dropped first "
                           "(default: %(default)s)")
    lora.add_argument("--max-lora-rank", type=int, default=64,
                      help="largest adapter rank accepted (default: %(default)s)")
    p.add_argument("--long-input", default="truncate", choices=["truncate", "chunk"],
                   help="/v1/embeddings default for inputs longer than the model: truncate, or "
                        "embed them window by window (a request's long_input overrides it) "
                        "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; the default accepts local connections only, "
                        "use 0.0.0.0 to expose the server (then set --api-key) (default: %(default)s)")
    p.add_argument("--port", type=port_number, default=8000,
                   help="TCP port, 1-65535 (default: %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients pass and responses report (default: MODEL; "
                        "for a local folder, the folder's name)")
    p.add_argument("--show-model-path", action="store_true",
                   help="show the model's folder in /info (model_path) and /v1/models (root); "
                        "hidden by default")
    p.add_argument("--max-input-items", type=int, default=d.max_input_items,
                   help="most inputs in one request (more gives 413); big requests are "
                        "split into engine batches internally (default: %(default)s)")
    p.add_argument("--max-payload-bytes", type=int, default=d.max_payload_bytes,
                   help="largest request body in bytes (more gives 413) (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="most inputs admitted and not yet answered, across all clients "
                        "(more gives 503 with Retry-After) (default: %(default)s)")
    p.add_argument("--max-queue-tokens", type=int, default=d.max_queue_tokens,
                   help="most tokens admitted and not yet answered (more gives 503 with "
                        "Retry-After); default: derived, the engine's measured tokens/s x "
                        "--max-queue-seconds")
    p.add_argument("--max-queue-seconds", type=float, default=d.max_queue_seconds,
                   help="with the derived token limit: admit about this many seconds of work "
                        "(default: %(default)s)")
    p.add_argument("--small-request-inputs", type=int, default=d.small_request_inputs,
                   help="a request of at most this many inputs is small: see "
                        "--small-request-slots (default: %(default)s)")
    p.add_argument("--small-request-slots", type=int, default=d.small_request_slots,
                   help="small requests are queued past the token limit while at most this "
                        "many requests are in flight, so steady closed-loop clients are never "
                        "refused; 0 turns this off (default: %(default)s)")
    p.add_argument("--max-workers", type=int, default=d.max_workers,
                   help="threads that tokenize and wait on the engine for HTTP requests (default: %(default)s)")
    p.add_argument("--graceful-timeout", type=float, default=d.graceful_timeout,
                   help="seconds to let in-flight requests finish on SIGTERM/SIGINT; then the "
                        "rest are aborted with 503 and the server exits (a second signal "
                        "exits at once) (default: %(default)s)")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout,
                   help="seconds a connection has to send a complete request head; then 408 "
                        "and close (default: %(default)s)")
    p.add_argument("--body-timeout", type=float, default=d.body_timeout,
                   help="seconds a request has to send its whole body after its head; then "
                        "408 and close (default: %(default)s)")
    p.add_argument("--keep-alive-timeout", type=float, default=d.keep_alive_timeout,
                   help="seconds an idle keep-alive connection stays open (default: %(default)s)")
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="most open connections; more are answered 503 and closed at once. "
                        "Kept below the open-files limit, which is raised to its hard limit "
                        "at start (default: %(default)s)")
    media = p.add_argument_group("images in requests (image-text models; docs/serving/http.md)")
    media.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                       help="accept file:// image URLs naming files under DIR (vLLM's flag); "
                            "refused by default")
    media.add_argument("--allow-private-media-urls", action="store_true",
                       help="let http(s) image URLs reach private, loopback and link-local "
                            "addresses (refused by default: a client could otherwise make the "
                            "server read internal services)")
    media.add_argument("--media-fetch-timeout", type=float, default=d.media_fetch_timeout,
                       help="seconds to fetch one image URL, redirects included; slower is a "
                            "400 naming the item (default: %(default)s)")
    media.add_argument("--max-image-bytes", type=int, default=d.max_image_bytes,
                       help="largest encoded image, fetched or sent inline (default: "
                            "%(default)s)")
    media.add_argument("--media-workers", type=int, default=d.media_workers,
                       help="threads fetching and decoding images (default: %(default)s)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn and pooler log level (default: %(default)s)")
    ops = p.add_argument_group("operating (docs/operating/index.md; gRPC and OTLP need "
                               "pooler's [ops] extra)")
    ops.add_argument("--log-format", default="text", choices=["text", "json"],
                     help="json: one JSON object per line for every log record, and one per "
                          "request (request id, route, status, tokens, durations) in place "
                          "of the access log, as TEI's --json-output (default: %(default)s)")
    ops.add_argument("--prometheus-port", type=port_number, default=None,
                     help="also serve /metrics on this port (same --host, no API key), as "
                          "TEI's --prometheus-port; /metrics stays on --port too")
    ops.add_argument("--grpc-port", type=port_number, default=None,
                     help="also serve TEI's gRPC API (tei.v1 with health and reflection) on "
                          "this port, on the same engine")
    ops.add_argument("--otlp-endpoint", default=None, metavar="URL",
                     help="export OpenTelemetry traces (a span per request with tokenize, "
                          "queue and inference children) over OTLP: http://HOST:4317 for "
                          "gRPC, or a URL ending in /v1/traces for HTTP; off by default")
    ops.add_argument("--otlp-service-name", default="pooler",
                     help="the traces' service.name (default: %(default)s)")
    ray = p.add_argument_group("Ray Serve (pooler's [ray] extra; see docs/scale-out.md)")
    ray.add_argument("--ray", action="store_true",
                     help="serve the same app as a Ray Serve deployment, one Engine per replica")
    ray.add_argument("--ray-address", default=None,
                     help="cluster to join (e.g. auto); default: start a local Ray")
    ray.add_argument("--replicas", type=int, default=1, help="replicas (default: %(default)s)")
    ray.add_argument("--autoscale", default=None, metavar="MIN,MAX",
                     help="autoscale between MIN and MAX replicas on ongoing requests")
    ray.add_argument("--target-ongoing-requests", type=float, default=16,
                     help="autoscaling target per replica (default: %(default)s)")
    ray.add_argument("--num-cpus-per-replica", type=float, default=1.0,
                     help="CPUs per replica; also the engine's threads on CPU (default: %(default)s)")
    ray.add_argument("--num-gpus-per-replica", type=float, default=0.0,
                     help="GPUs per replica (default: %(default)s)")
    ray.add_argument("--request-timeout", type=float, default=300,
                     help="seconds before Serve's proxy answers 408 (default: %(default)s)")
    peer_flags.add(p, port_number)  # last: TEI's variables become the options' defaults
    p.set_defaults(func=run)


def parse_lora_module(text: str) -> tuple[str, str]:
    """NAME=PATH, or vLLM's JSON form {"name": ..., "path": ...}."""
    import argparse
    import json

    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules: {exc}") from None
        if not isinstance(spec.get("name"), str) or not isinstance(spec.get("path"), str):
            raise argparse.ArgumentTypeError(
                '--lora-modules JSON needs string "name" and "path" fields.')
        return spec["name"], spec["path"]
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora-modules takes NAME=PATH, got {text!r}.")
    return name, path


def _settings(args):
    from pooler.server.settings import ServerSettings

    return ServerSettings(
        served_model_name=args.served_model_name, api_key=args.api_key,
        max_input_items=args.max_input_items, max_payload_bytes=args.max_payload_bytes,
        max_queue=args.max_queue, max_workers=args.max_workers,
        graceful_timeout=args.graceful_timeout, header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections, show_model_path=args.show_model_path,
        long_input=args.long_input, max_queue_tokens=args.max_queue_tokens,
        max_queue_seconds=args.max_queue_seconds,
        prometheus_port=args.prometheus_port, grpc_port=args.grpc_port,
        listen_host=args.host, otlp_endpoint=args.otlp_endpoint,
        otlp_service_name=args.otlp_service_name, log_requests=args.log_format == "json",
        small_request_inputs=args.small_request_inputs,
        small_request_slots=args.small_request_slots,
        allowed_local_media_path=args.allowed_local_media_path,
        allow_private_media_urls=args.allow_private_media_urls,
        media_fetch_timeout=args.media_fetch_timeout, max_image_bytes=args.max_image_bytes,
        media_workers=args.media_workers)


def _one_model_only(settings, how: str) -> None:
    """The extra listeners belong to one app: refuse them where there would be several."""
    for flag, value in (("--grpc-port", settings.grpc_port),
                        ("--prometheus-port", settings.prometheus_port)):
        if value is not None:
            raise ValueError(f"{flag} serves one model's app; it is not available {how}.")


def build_app(args):
    """One model: its app. Several (--model repeated, or --models-config): a ModelRouter in
    front of one app per model, each with its own engine and queue."""
    from pooler.server.app import create_app

    specs = model_specs(args)
    if len(specs) == 1:
        args.model = specs[0]["model"]
        return create_app(engine_from_args(args), _settings(args))
    from dataclasses import replace

    from pooler.engine.llm import Engine
    from pooler.server.multi_model import ModelRouter, ServedModel, resident_mb

    if args.lora_modules or args.enable_lora:
        raise ValueError("--lora-modules / --enable-lora apply to one served model; with "
                         "several, give each its adapters in --models-config "
                         "(lora_modules = {NAME = \"PATH\"}).")
    settings = _settings(args)
    _one_model_only(settings, "with several models (their /metrics routes stay)")
    served = []
    for spec in specs:
        options = {**engine_kwargs(args), **spec}
        name = options.pop("name", None)
        before = resident_mb()
        engine = Engine(options.pop("model"), **options)
        app = create_app(engine, replace(settings, served_model_name=name))
        memory = resident_mb() - before
        logger.info("loaded %s: %.0f MB resident", app.state.pooler.model_name, memory)
        served.append(ServedModel(app.state.pooler.model_name, app, memory))
    return ModelRouter(served, api_key=settings.api_key,
                       max_body_bytes=settings.max_payload_bytes)


def model_specs(args) -> list[dict]:
    """The models to serve: --models-config's tables, else each --model (or MODEL)."""
    from pooler.model_folder import DEFAULT_MODEL

    models = ([args.model_arg] if args.model_arg else []) + list(args.model or [])
    if args.models_config:
        if models:
            raise ValueError("give the models either with --model/MODEL or in --models-config, "
                             "not both.")
        return read_models_config(args.models_config)
    if len(models) > 1 and args.served_model_name:
        raise ValueError("--served-model-name names one model; with several, give each a name "
                         "in --models-config (name = ...).")
    return [{"model": m} for m in models] or [{"model": DEFAULT_MODEL}]


def read_models_config(path: str) -> list[dict]:
    import tomllib

    with open(path, "rb") as f:
        config = tomllib.load(f)
    tables = config.get("models")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"{path}: expected one [[models]] table per model, with model = ...")
    allowed = {"model", "name", "task", "runner", "dtype", "device", "max_model_len",
               "max_num_batched_tokens", "max_num_seqs", "num_threads", "quantization",
               "precision_check", "revision", "hf_overrides", "lora_modules", "enable_lora",
               "max_loras", "max_lora_rank"}
    for i, table in enumerate(tables):
        if "model" not in table:
            raise ValueError(f"{path}: [[models]] number {i + 1} has no model = ...")
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise ValueError(f"{path}: [[models]] number {i + 1} has unknown keys {unknown}; "
                             f"allowed: {sorted(allowed)}.")
    return [dict(t) for t in tables]


def run_ray(args) -> int:
    try:
        from pooler.ray.serve import parse_autoscale, run_serve, serve_app
    except ImportError as exc:
        from pooler.install_hint import install_command

        raise ValueError(f"--ray needs Ray Serve ({exc}); pooler's [ray] extra has it. Install "
                         f"it with: {install_command('ray')}") from None
    specs = model_specs(args)
    if len(specs) > 1:
        raise ValueError("--ray serves one model; run one deployment per model.")
    args.model = specs[0]["model"]
    _one_model_only(_settings(args), "with --ray")
    kwargs = engine_kwargs(args)
    app = serve_app(kwargs.pop("model"), replicas=args.replicas,
                    autoscale=parse_autoscale(args.autoscale),
                    target_ongoing_requests=args.target_ongoing_requests,
                    num_cpus=args.num_cpus_per_replica, num_gpus=args.num_gpus_per_replica,
                    engine_kwargs=kwargs, settings=_settings(args))
    autoscale = parse_autoscale(args.autoscale)
    run_serve(app, host=args.host, port=args.port, address=args.ray_address,
              request_timeout_s=args.request_timeout,
              replicas=max(autoscale[0], 1) if autoscale else args.replicas,
              num_cpus=args.num_cpus_per_replica, num_gpus=args.num_gpus_per_replica)
    return 0


def port_number(text: str) -> int:
    """argparse type for --port: an integer in 1-65535 (bind() would raise OverflowError)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: a TCP port is 1-65535")
    return port


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """Fail in a second, before torch is imported or the model loads, when the address cannot
    be bound, with the reason in words: a host name that does not resolve, an address this
    machine does not have, a privileged port, or a port in use."""
    try:
        # the address uvicorn will bind: the first one getaddrinfo gives, as asyncio does
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ValueError(f"cannot listen on {host}:{port}: the host {host!r} does not resolve "
                         f"({exc.strerror or exc}). Pass --host an address of this machine "
                         "(127.0.0.1 for local clients, 0.0.0.0 for every interface) or a "
                         "name that resolves to one.") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}. "
                             f"{_bind_hint(exc.errno, host, port, flag)}") from None


def _bind_hint(errno_code: int | None, host: str, port: int, flag: str) -> str:
    if errno_code == errno.EADDRINUSE:
        return f"Another server is using the port: stop it or pick another with {flag}."
    if errno_code == errno.EADDRNOTAVAIL:
        return (f"No interface of this machine has the address {host}: use 127.0.0.1, "
                "0.0.0.0, or one of this machine's addresses with --host.")
    if errno_code == errno.EACCES and port < 1024:
        return f"Ports below 1024 need root: pick one from 1024 up with {flag}."
    return f"Pick another --host or {flag}."


def warn_if_exposed(host: str, api_key: str | None) -> None:
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without --api-key: anyone who can reach this machine "
                       "can use the model. Set --api-key KEY (clients then send "
                       "'Authorization: Bearer KEY').", host)


def run(args) -> int:
    peer_flags.apply(args)  # TEI's / vLLM's spellings, checked before anything loads
    # Before anything imports torch (seconds): a wrong address fails at once.
    check_port(args.host, args.port)
    for flag in ("--grpc-port", "--prometheus-port"):
        extra = getattr(args, flag[2:].replace("-", "_"), None)
        if extra is not None:
            if extra == args.port:
                raise ValueError(f"{flag} {extra} is the HTTP --port: pick another port.")
            check_port(args.host, extra, flag)
    json_logs = getattr(args, "log_format", "text") == "json"
    if json_logs:
        from pooler.server.observability.json_logs import configure

        configure(args.log_level)
    else:
        logging.basicConfig(level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warn_if_exposed(args.host, args.api_key)
    peer_flags.report(args)

    import uvicorn

    from pooler.server.edges.connection_limits import (accept_backlog, fit_connection_cap,
                                                       guarded_h11_protocol, install_log_rate_limit,
                                                       raise_fd_limit)
    from pooler.server.edges.shutdown import GracefulServer, uvicorn_backstop

    if args.ray:
        return run_ray(args)
    install_log_rate_limit()
    app = build_app(args)
    peer_flags.after_build(app, args)
    # A ModelRouter (several models) has each model's state; the first one's limits and
    # metrics count connections, and a shutdown reaches every model.
    state = app.state.pooler if hasattr(app, "state") else app.models[0].app.state.pooler
    gate = app.shutdown_gate if hasattr(app, "shutdown_gate") else state.shutdown
    settings = state.settings
    fd_limit = raise_fd_limit()
    cap = fit_connection_cap(settings.max_connections, fd_limit)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        backlog=accept_backlog(fd_limit),
        http=guarded_h11_protocol(cap, settings.header_timeout, state.metrics),
        timeout_keep_alive=settings.keep_alive_timeout,
        timeout_graceful_shutdown=uvicorn_backstop(settings.graceful_timeout),
        # JSON: uvicorn's records go to the JSON root handler; the per-request record
        # replaces its access log.
        **({"log_config": None, "access_log": False} if json_logs else {}))
    server = GracefulServer(config, gate, settings.graceful_timeout)
    server.run()
    if server.signalled:
        # Everything is answered and the engine stopped. Skip the interpreter's teardown
        # (seconds on a busy machine: torch and tokenizer destructors), which would push the
        # exit past the bound an orchestrator allows after SIGTERM.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
