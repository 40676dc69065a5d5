"""`pooler serve MODEL`: the HTTP server (FastAPI on uvicorn).

SIGTERM / Ctrl-C: stop accepting connections, let in-flight requests finish (up to
--graceful-timeout seconds), abort the rest (503 with Retry-After) and exit 0; a second
signal exits at once (pooler/server/shutdown.py). Slow clients are bounded by
--header-timeout, --body-timeout, --keep-alive-timeout and --max-connections
(pooler/server/connection_limits.py).
"""
from __future__ import annotations

import logging
import os
import sys

from pooler.cli.common import add_engine_args, engine_from_args


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
                   help="model folder, installed model package name, or HF cache name "
                        "(same as --model)")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; the default accepts local connections only, "
                        "use 0.0.0.0 to expose the server (then set --api-key) (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
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
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn and pooler log level (default: %(default)s)")
    p.set_defaults(func=run)


def build_app(args):
    from pooler.server.app import create_app
    from pooler.server.settings import ServerSettings

    if args.model_arg:
        args.model = args.model_arg
    settings = ServerSettings(
        served_model_name=args.served_model_name, api_key=args.api_key,
        max_input_items=args.max_input_items, max_payload_bytes=args.max_payload_bytes,
        max_queue=args.max_queue, max_workers=args.max_workers,
        graceful_timeout=args.graceful_timeout, header_timeout=args.header_timeout,
        body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections, show_model_path=args.show_model_path)
    return create_app(engine_from_args(args), settings)


def run(args) -> int:
    import uvicorn

    from pooler.server.connection_limits import (accept_backlog, fit_connection_cap,
                                                 guarded_h11_protocol, install_log_rate_limit,
                                                 raise_fd_limit)
    from pooler.server.shutdown import GracefulServer, uvicorn_backstop

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_rate_limit()
    app = build_app(args)
    state = app.state.pooler
    settings = state.settings
    fd_limit = raise_fd_limit()
    cap = fit_connection_cap(settings.max_connections, fd_limit)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        backlog=accept_backlog(fd_limit),
        http=guarded_h11_protocol(cap, settings.header_timeout, state.metrics),
        timeout_keep_alive=settings.keep_alive_timeout,
        timeout_graceful_shutdown=uvicorn_backstop(settings.graceful_timeout))
    server = GracefulServer(config, state.shutdown, settings.graceful_timeout)
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
