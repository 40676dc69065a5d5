"""The app factory: `create_app(engine, settings)` -> a FastAPI app serving that engine.

The lifespan starts the engine's background loop (one thread owns the model; handlers'
requests from every client join its batches), then marks the server ready. On shutdown
(uvicorn finishes in-flight requests first on SIGTERM, bounded as edges/shutdown.py says) it stops
the loop, cancelling whatever is left, so the process always exits.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from pooler.server.dialects import cohere, openai, tei
from pooler.server.dialects.native import bge_m3, long_inputs, ner
from pooler.server.dialects.vllm import lora, rerank
from pooler.server.dialects.vllm import routes as vllm
from pooler.server.edges.auth import APIKeyMiddleware
from pooler.server.edges.connection_limits import BodyTimeoutMiddleware
from pooler.server.edges.invalid_text import InvalidTextMiddleware
from pooler.server.edges.limits import PayloadLimitMiddleware, QueueGateMiddleware
from pooler.server.edges.refusals import RefusalShapes
from pooler.server.errors import (ERROR_RESPONSES, error_response, install_error_handlers,
                                  validation_message)
from pooler.server.observability.metrics import MetricsMiddleware, ServerMetrics
from pooler.server.openapi_spec import narrow_openapi
from pooler.server.protocol import InfoResponse
from pooler.server.state import ServerSettings, ServerState

logger = logging.getLogger(__name__)

# Seconds the engine may take at shutdown to finish the step it is in (the work itself was
# already aborted or answered when the graceful timeout ran out).
_ENGINE_STOP_SECONDS = 5.0


def _version() -> str:
    try:
        return version("pooler")
    except PackageNotFoundError:
        return "0.1.0"


def create_app(engine, settings: ServerSettings | None = None, *,
               owns_engine: bool = True) -> FastAPI:
    """owns_engine=False leaves the engine's loop running at shutdown (tests that serve one
    engine from several apps)."""
    settings = settings or ServerSettings()
    metrics = ServerMetrics()
    state = ServerState(engine, settings, metrics)
    metrics.add_peer_metrics(state.model_name, engine.model_config.max_model_len)
    tracer = _add_request_observers(metrics, settings, state.model_name)
    if callable(getattr(engine, "image_cache_stats", None)) and \
            engine.image_cache_stats() is not None:
        metrics.add_image_cache_metrics(engine.image_cache_stats)

    def scrape() -> tuple[bytes, str]:
        metrics.observe_engine(engine)
        metrics.draining.set(1 if state.shutdown.draining else 0)
        return metrics.render()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = engine.start_background_loop()
        if metrics.on_step not in loop.step_listeners:
            loop.step_listeners.append(metrics.on_step)
            loop.queue_listeners.append(metrics.on_queued)
            loop.finish_listeners.append(metrics.on_finished)
        side_servers = await _start_side_servers(app, settings, scrape)
        state.ready = True
        logger.info("pooler serving %s (tasks %s)", state.model_name,
                    sorted(engine.supported_tasks))
        try:
            yield
        finally:
            state.ready = False
            for stop in side_servers:
                await stop()
            if tracer is not None:
                tracer.shutdown()  # sends the spans still buffered
            loop.step_listeners.remove(metrics.on_step)
            loop.queue_listeners.remove(metrics.on_queued)
            loop.finish_listeners.remove(metrics.on_finished)
            if owns_engine:
                await asyncio.get_running_loop().run_in_executor(
                    None, engine.shutdown, _ENGINE_STOP_SECONDS)
            # Handlers have all returned; a worker thread still running is finishing a
            # cancelled engine call and ends within one poll.
            state.executor.shutdown(wait=False, cancel_futures=True)
            state.tokenizer_executor.shutdown(wait=False, cancel_futures=True)
            state.media.shutdown()

    app = FastAPI(title="pooler", version=_version(), lifespan=lifespan,
                  description="Embeddings, reranking, classification, NER and sparse vectors "
                              "behind OpenAI-, Cohere/Jina-, vLLM- and TEI-compatible routes.")
    app.state.pooler = state
    app.state.tracer = tracer
    install_error_handlers(app)

    @app.exception_handler(ValidationError)
    async def _model_validation(request: Request, exc: ValidationError):
        message, param = validation_message(list(exc.errors()))
        return error_response(400, message, param, "invalid_value")

    for module in (openai, vllm, rerank, tei, cohere, ner, bge_m3, long_inputs, lora):
        app.include_router(module.router)

    default_openapi = app.openapi

    def model_openapi():
        # FastAPI caches the spec on app.openapi_schema: narrow it once, on first use.
        if app.openapi_schema is None:
            app.openapi_schema = narrow_openapi(default_openapi(), engine,
                                                long_input=settings.long_input)
        return app.openapi_schema

    app.openapi = model_openapi

    @app.get("/health", tags=["common"], responses={
        200: {"description": "ready", "content": {"application/json": {"example": {
            "status": "ok"}}}}, 503: ERROR_RESPONSES[503]})
    async def health():
        """200 once the model is loaded and the engine loop runs; 503 before and while
        shutting down. Needs no API key."""
        if state.shutdown.draining:
            return error_response(503, "The server is shutting down.", None, "shutting_down")
        if not state.ready:
            return error_response(503, "The model is not loaded yet.", None, "not_ready")
        return JSONResponse({"status": "ok"})

    @app.get("/info", response_model=InfoResponse, tags=["common"], responses=ERROR_RESPONSES)
    async def info():
        mc, sc = engine.model_config, engine.config.scheduler_config
        return {**tei.info_fields(state, _version()), "model_id": state.model_name,
                "model_path": str(mc.path) if settings.show_model_path else None,
                "model_dtype": mc.dtype, "architecture": mc.architecture,
                "tasks": sorted(engine.supported_tasks), "default_task": engine.default_task,
                "embedding_dimensions": engine.embedding_size,
                "max_input_length": mc.max_model_len,
                "max_batch_tokens": sc.max_num_batched_tokens,
                "max_batch_requests": sc.max_num_seqs,
                "max_client_batch_size": settings.max_input_items,
                "max_payload_bytes": settings.max_payload_bytes,
                "max_queue": settings.max_queue, "version": _version()}

    @app.get("/metrics", tags=["common"], response_class=Response, responses={200: {
        "description": "Prometheus text exposition format",
        "content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus_metrics():
        body, content_type = scrape()
        return Response(body, media_type=content_type)

    # The last added runs first: count everything (401s too), bound the time to send a body,
    # check the key before reading a body, refuse what the token queue has no room for, bound
    # the body's size, then reject invalid text.
    app.add_middleware(InvalidTextMiddleware)
    app.add_middleware(PayloadLimitMiddleware, max_bytes=settings.max_payload_bytes)
    app.add_middleware(QueueGateMiddleware, admission=state.token_admission,
                       shapes=RefusalShapes())
    if settings.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=settings.api_key, routes=app.router.routes)
    app.add_middleware(BodyTimeoutMiddleware, timeout=settings.body_timeout,
                       gate=state.shutdown, metrics=metrics)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _add_request_observers(metrics: ServerMetrics, settings: ServerSettings, model_name: str):
    """Traces and the per-request JSON log, when asked for (nothing is built otherwise).
    Returns the tracer (to flush at shutdown) or None."""
    tracer = None
    if settings.otlp_endpoint:
        from pooler.server.observability.tracing import RequestTracer

        tracer = RequestTracer(settings.otlp_endpoint, settings.otlp_service_name, model_name)
        metrics.request_observers.append(tracer.on_request)
    if settings.log_requests:
        from pooler.server.observability.json_logs import log_request

        metrics.request_observers.append(log_request)
    return tracer


async def _start_side_servers(app: FastAPI, settings: ServerSettings, scrape) -> list:
    """--prometheus-port and --grpc-port listeners; returns their async stop functions."""
    stops = []
    if settings.prometheus_port is not None:
        from pooler.server.observability.metrics import serve_metrics_port

        server = serve_metrics_port(settings.listen_host, settings.prometheus_port, scrape)
        app.state.prometheus_port = server.server_address[1]  # the real one when asked for 0

        async def stop_metrics_port():
            await asyncio.get_running_loop().run_in_executor(None, server.shutdown)
            server.server_close()

        stops.append(stop_metrics_port)
        logger.info("Prometheus metrics on http://%s:%d/metrics", settings.listen_host,
                    server.server_address[1])
    if settings.grpc_port is not None:
        from pooler.server.grpc.server import start_grpc_server

        stops.append(await start_grpc_server(app, settings.listen_host, settings.grpc_port))
    return stops
