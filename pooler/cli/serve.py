"""`pooler serve MODEL`: the HTTP server (FastAPI on uvicorn).

SIGTERM / Ctrl-C: uvicorn stops accepting connections, lets in-flight requests finish (up to
--graceful-timeout seconds), then the app drains the engine and exits.
"""
from __future__ import annotations

import logging

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
                   help="the model name clients pass and responses report (default: MODEL)")
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
    p.add_argument("--max-workers", type=int, default=d.max_workers,
                   help="threads that tokenize and wait on the engine for HTTP requests (default: %(default)s)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish on SIGTERM (default: %(default)s)")
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
        max_queue_tokens=args.max_queue_tokens, max_queue_seconds=args.max_queue_seconds)
    return create_app(engine_from_args(args), settings)


def run(args) -> int:
    import uvicorn

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(args)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=args.graceful_timeout)
    return 0
