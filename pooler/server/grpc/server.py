"""TEI's gRPC API (`--grpc-port`): the tei.v1 services Info, Embed (Embed, EmbedSparse,
EmbedAll), Predict (Predict, PredictPair), Rerank, Tokenize (Tokenize, Decode) and their
streaming variants, with gRPC server reflection and the standard health service
(grpc.health.v1), on grpcio's asyncio server in the HTTP server's event loop.

Each RPC runs as the matching TEI HTTP route of the same app, called in process through ASGI
(no socket, no HTTP parsing): the same engine and queue, the same validation and error
messages, the same admission limits, metrics, traces and logs, so a gRPC call and an HTTP
call give the same numbers. The JSON between the two is the only extra work (floats round-trip
exactly: a float32 printed by Python's repr parses back to the same float32).

As TEI's gRPC server: `truncate` is the request's flag (proto3: false unless set, so an
over-long input is an error, where HTTP auto-truncates); `normalize` unset means true; errors
map TEI's error types to status codes (Validation and Empty: INVALID_ARGUMENT, Backend and
Tokenizer: FAILED_PRECONDITION, Overloaded: RESOURCE_EXHAUSTED, Unhealthy: UNAVAILABLE);
with --api-key every tei.v1 call needs metadata `authorization: Bearer KEY`
(UNAUTHENTICATED otherwise) while health and reflection stay open.

pooler's addition, long documents on Rerank and RerankStream (the HTTP body's long_input,
chunk_overlap and chunk_aggregate): TEI's RerankRequest has no field for them, and a field pooler
added to tei.proto would make its messages differ from the ones TEI clients are generated from,
so a call asks through its metadata, as it sends `authorization`: `pooler-long-input: chunk`,
with optional `pooler-chunk-overlap: N` and `pooler-chunk-aggregate: max|mean`
(`_LONG_DOCUMENT_METADATA`; a bad value is INVALID_ARGUMENT naming the key). Without them a
call truncates or fails as TEI's does. The ranks carry no window count (TEI's Rank message has
no field for it; HTTP's num_windows does). A stream answers its
messages in order, running up to `_STREAM_PARALLEL` of them at once so they share engine
batches; the first failing message ends the stream with its status.

The stubs (generated/: tei_pb2.py, tei_pb2_grpc.py, tei_pb2.pyi) are generated from tei.proto
and committed, not generated at install or first use: serving then needs no protoc (grpcio-tools
is a build tool with a bundled compiler, kept to the test extra), a wheel installs offline,
and the code that serves is the code that was reviewed. `make proto` regenerates them;
tests/server/test_grpc.py regenerates them in a temporary folder and fails on any drift.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pooler.server.asgi_call import call_asgi
from pooler.server.dialects import tei
from pooler.server.grpc.generated import tei_pb2 as pb, tei_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

# Messages of one stream computed at once (TEI: max_parallel_stream_requests).
_STREAM_PARALLEL = 64
# Seconds in-flight calls may finish at shutdown.
_GRACE_SECONDS = 5.0

_TEI_CODES = {"Validation": grpc.StatusCode.INVALID_ARGUMENT,
              "Empty": grpc.StatusCode.INVALID_ARGUMENT,
              "Tokenizer": grpc.StatusCode.FAILED_PRECONDITION,
              "Backend": grpc.StatusCode.FAILED_PRECONDITION,
              "Overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
              "Unhealthy": grpc.StatusCode.UNAVAILABLE}
_HTTP_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.INVALID_ARGUMENT,
               422: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
               404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.CANCELLED,
               424: grpc.StatusCode.FAILED_PRECONDITION, 499: grpc.StatusCode.CANCELLED,
               429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
_MODEL_TYPES = {"embedding": pb.MODEL_TYPE_EMBEDDING, "classifier": pb.MODEL_TYPE_CLASSIFIER,
                "reranker": pb.MODEL_TYPE_RERANKER}
# Metadata passed on to the HTTP route: the API key and the caller's trace context.
_FORWARDED = ("authorization", "traceparent", "tracestate")
# call metadata key -> the /rerank body field it sets (pooler's long documents, see above)
_LONG_DOCUMENT_METADATA = {"pooler-long-input": "long_input",
                           "pooler-chunk-overlap": "chunk_overlap",
                           "pooler-chunk-aggregate": "chunk_aggregate"}


class RPCFailure(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _failure(status: int, payload: Any) -> RPCFailure:
    """An HTTP error answer as a gRPC status: TEI's error type decides, else the status."""
    if isinstance(payload, dict) and "error_type" in payload:
        return RPCFailure(_TEI_CODES.get(payload["error_type"], grpc.StatusCode.UNKNOWN),
                          str(payload.get("error")))
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else str(payload)
    code = _HTTP_CODES.get(status, grpc.StatusCode.INTERNAL)
    if status == 503 and isinstance(error, dict) and error.get("code") == "queue_full":
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    return RPCFailure(code, message)


def _direction(value: int) -> str:
    return "Left" if value == pb.TRUNCATION_DIRECTION_LEFT else "Right"


class RouteCaller:
    """Runs one request through the app's ASGI stack in process."""

    def __init__(self, app):
        self.app = app

    async def call(self, context: grpc.aio.ServicerContext, rpc: str, method: str, path: str,
                   body: dict | None = None) -> tuple[Any, dict]:
        """(parsed JSON answer, the ASGI scope the route saw); an error answer raises
        RPCFailure."""
        payload = b"" if body is None else json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]
        for key, value in context.invocation_metadata() or ():
            if key in _FORWARDED and isinstance(value, str):
                headers.append((key.encode(), value.encode("latin-1")))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "2",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": headers, "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 0), "pooler.grpc_method": rpc}
        status, raw = await call_asgi(self.app, scope, payload)
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        if status >= 400:
            raise _failure(status, data)
        return data, scope


def _metadata(scope: dict, chars: int, started: float) -> pb.Metadata:
    """TEI's per-call Metadata from what the route's engine call recorded."""
    call = scope.get("pooler.call")
    outputs = call.finished if call is not None else []
    timed = [o.timing for o in outputs if o.timing is not None]

    def mean_ns(seconds: list[float]) -> int:  # TEI reports a batch's means
        return int(sum(seconds) / len(seconds) * 1e9) if seconds else 0

    return pb.Metadata(
        compute_chars=chars, compute_tokens=sum(o.num_tokens for o in outputs),
        total_time_ns=int((time.perf_counter() - started) * 1e9),
        tokenization_time_ns=int((call.tokenize_seconds if call else 0.0) * 1e9),
        queue_time_ns=mean_ns([t.queue_seconds for t in timed]),
        inference_time_ns=mean_ns([t.inference_seconds for t in timed]))


def _long_document_options(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """The /rerank body fields a call's pooler-* metadata sets; a bad value is
    INVALID_ARGUMENT naming the metadata key and what it takes."""
    options: dict[str, Any] = {}
    for key, value in context.invocation_metadata() or ():
        field = _LONG_DOCUMENT_METADATA.get(key)
        if field is None or not isinstance(value, str):
            continue
        value = value.strip()
        takes = {"long_input": ("truncate", "chunk"), "chunk_aggregate": ("max", "mean")}
        if field == "chunk_overlap":
            if not value.isdigit():
                raise RPCFailure(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"metadata '{key}' must be a whole number of tokens >= 0, "
                                 f"got {value!r}.")
            options[field] = int(value)
        elif value not in takes[field]:
            raise RPCFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"metadata '{key}' must be one of {list(takes[field])}, got "
                             f"{value!r}.")
        else:
            options[field] = value
    return options


async def _unary(context, run: Callable[[], Awaitable[Any]]):
    try:
        return await run()
    except RPCFailure as failure:
        await context.abort(failure.code, failure.message)


async def _ordered(requests: AsyncIterator, handle: Callable[[Any], Awaitable[Any]], context):
    """Answer a stream's messages in order, computing up to _STREAM_PARALLEL at once."""
    pending: asyncio.Queue = asyncio.Queue(_STREAM_PARALLEL)

    async def feed():
        async for message in requests:
            await pending.put(asyncio.ensure_future(handle(message)))
        await pending.put(None)

    feeder = asyncio.ensure_future(feed())
    try:
        while True:
            task = await pending.get()
            if task is None:
                break
            try:
                yield await task
            except RPCFailure as failure:
                await context.abort(failure.code, failure.message)
        await feeder  # re-raises a failure of the request stream itself
    finally:
        feeder.cancel()
        while not pending.empty():
            task = pending.get_nowait()
            if task is not None:
                task.cancel()


class TEIService(pb_grpc.InfoServicer, pb_grpc.EmbedServicer, pb_grpc.PredictServicer,
                 pb_grpc.RerankServicer, pb_grpc.TokenizeServicer):
    """Every tei.v1 RPC as the TEI route that answers it over HTTP."""

    def __init__(self, app):
        self.routes = RouteCaller(app)

    # ---- Info ---------------------------------------------------------------------------------
    async def Info(self, request, context):  # noqa: N802 (the proto's names)
        async def run():
            info, _ = await self.routes.call(context, "tei.v1.Info/Info", "GET", "/info")
            kind = next(iter(info["model_type"]))
            optional = {k: info[k] for k in ("sha", "docker_label", "model_sha",
                                             "max_batch_requests") if info.get(k) is not None}
            return pb.InfoResponse(
                version=info["version"], model_id=info["model_id"],
                model_dtype=info["model_dtype"], model_type=_MODEL_TYPES[kind],
                max_concurrent_requests=info["max_concurrent_requests"],
                max_input_length=info["max_input_length"],
                max_batch_tokens=info["max_batch_tokens"],
                max_client_batch_size=info["max_client_batch_size"],
                tokenization_workers=info["tokenization_workers"], **optional)
        return await _unary(context, run)

    # ---- Embed --------------------------------------------------------------------------------
    async def _embed(self, request, context, rpc="tei.v1.Embed/Embed"):
        started = time.perf_counter()
        body = {"inputs": request.inputs, "truncate": request.truncate,
                "truncation_direction": _direction(request.truncation_direction),
                "normalize": request.normalize if request.HasField("normalize") else True}
        if request.HasField("prompt_name"):
            body["prompt_name"] = request.prompt_name
        if request.HasField("dimensions"):
            body["dimensions"] = request.dimensions
        vectors, scope = await self.routes.call(context, rpc, "POST", "/embed", body)
        return pb.EmbedResponse(embeddings=vectors[0],
                                metadata=_metadata(scope, len(request.inputs), started))

    async def _embed_sparse(self, request, context, rpc="tei.v1.Embed/EmbedSparse"):
        started = time.perf_counter()
        body = self._text_body(request)
        rows, scope = await self.routes.call(context, rpc, "POST", "/embed_sparse", body)
        return pb.EmbedSparseResponse(
            sparse_embeddings=[pb.SparseValue(index=v["index"], value=v["value"])
                               for v in rows[0]],
            metadata=_metadata(scope, len(request.inputs), started))

    async def _embed_all(self, request, context, rpc="tei.v1.Embed/EmbedAll"):
        started = time.perf_counter()
        body = self._text_body(request)
        matrices, scope = await self.routes.call(context, rpc, "POST", "/embed_all", body)
        return pb.EmbedAllResponse(
            token_embeddings=[pb.TokenEmbedding(embeddings=row) for row in matrices[0]],
            metadata=_metadata(scope, len(request.inputs), started))

    @staticmethod
    def _text_body(request) -> dict:
        body = {"inputs": request.inputs, "truncate": request.truncate,
                "truncation_direction": _direction(request.truncation_direction)}
        if request.HasField("prompt_name"):
            body["prompt_name"] = request.prompt_name
        return body

    async def Embed(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._embed(request, context))

    async def EmbedStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._embed(
                r, context, "tei.v1.Embed/EmbedStream"), context):
            yield answer

    async def EmbedSparse(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._embed_sparse(request, context))

    async def EmbedSparseStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._embed_sparse(
                r, context, "tei.v1.Embed/EmbedSparseStream"), context):
            yield answer

    async def EmbedAll(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._embed_all(request, context))

    async def EmbedAllStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._embed_all(
                r, context, "tei.v1.Embed/EmbedAllStream"), context):
            yield answer

    # ---- Predict ------------------------------------------------------------------------------
    async def _predict(self, request, context, inputs, rpc: str):
        started = time.perf_counter()
        body = {"inputs": inputs, "truncate": request.truncate,
                "raw_scores": request.raw_scores,
                "truncation_direction": _direction(request.truncation_direction)}
        ranked, scope = await self.routes.call(context, rpc, "POST", "/predict", body)
        chars = len(inputs) if isinstance(inputs, str) else sum(len(t) for t in inputs)
        return pb.PredictResponse(
            predictions=[pb.Prediction(score=p["score"], label=p["label"]) for p in ranked],
            metadata=_metadata(scope, chars, started))

    async def _predict_pair(self, request, context, rpc="tei.v1.Predict/PredictPair"):
        if len(request.inputs) not in (1, 2):
            raise RPCFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             "`inputs` must have a single or two elements. Given: "
                             f"{len(request.inputs)}")
        return await self._predict(request, context, list(request.inputs), rpc)

    async def Predict(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._predict(
            request, context, request.inputs, "tei.v1.Predict/Predict"))

    async def PredictPair(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._predict_pair(request, context))

    async def PredictStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._predict(
                r, context, r.inputs, "tei.v1.Predict/PredictStream"), context):
            yield answer

    async def PredictPairStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._predict_pair(
                r, context, "tei.v1.Predict/PredictPairStream"), context):
            yield answer

    # ---- Rerank -------------------------------------------------------------------------------
    async def _rerank(self, context, query: str, texts: list[str], flags, rpc: str,
                      started: float):
        body = {"query": query, "texts": texts, "truncate": flags.truncate,
                "raw_scores": flags.raw_scores, "return_text": flags.return_text,
                "truncation_direction": _direction(flags.truncation_direction),
                **_long_document_options(context)}
        ranks, scope = await self.routes.call(context, rpc, "POST", "/rerank", body)
        chars = len(query) * len(texts) + sum(len(t) for t in texts)
        return ranks, _metadata(scope, chars, started)

    @staticmethod
    def _rank(item: dict) -> pb.Rank:
        rank = pb.Rank(index=item["index"], score=item["score"])
        if item.get("text") is not None:
            rank.text = item["text"]
        return rank

    async def Rerank(self, request, context):  # noqa: N802
        async def run():
            ranks, metadata = await self._rerank(context, request.query, list(request.texts),
                                                 request, "tei.v1.Rerank/Rerank",
                                                 time.perf_counter())
            return pb.RerankResponse(ranks=[self._rank(r) for r in ranks], metadata=metadata)
        return await _unary(context, run)

    async def RerankStream(self, request_iterator, context):  # noqa: N802
        """Collect the (query, text) messages, then rank them all at once: one /rerank call
        per distinct query, the indices those of the messages, best score first."""
        started = time.perf_counter()
        messages = [m async for m in request_iterator]

        async def run():
            if not messages:
                raise RPCFailure(grpc.StatusCode.INVALID_ARGUMENT, "`texts` cannot be empty")
            first = messages[0]
            by_query: dict[str, list[int]] = {}
            for i, m in enumerate(messages):
                by_query.setdefault(m.query, []).append(i)
            ranks, metadata = [], None
            for query, where in by_query.items():
                part, metadata = await self._rerank(
                    context, query, [messages[i].text for i in where], first,
                    "tei.v1.Rerank/RerankStream", started)
                ranks += [{**r, "index": where[r["index"]]} for r in part]
            # Highest first; of equal scores the later message first, as TEI's sort.
            ranks.sort(key=lambda r: (r["score"], r["index"]), reverse=True)
            return pb.RerankResponse(ranks=[self._rank(r) for r in ranks], metadata=metadata)
        return await _unary(context, run)

    # ---- Tokenize -----------------------------------------------------------------------------
    async def _tokenize(self, request, context, rpc="tei.v1.Tokenize/Tokenize"):
        body = {"inputs": request.inputs, "add_special_tokens": request.add_special_tokens}
        if request.HasField("prompt_name"):
            body["prompt_name"] = request.prompt_name
        tokens, _ = await self.routes.call(context, rpc, "POST", "/tokenize", body)
        out = []
        for t in tokens[0]:
            token = pb.SimpleToken(id=t["id"], text=t["text"], special=t["special"])
            if t.get("start") is not None:
                token.start, token.stop = t["start"], t["stop"]
            out.append(token)
        return pb.EncodeResponse(tokens=out)

    async def _decode(self, request, context, rpc="tei.v1.Tokenize/Decode"):
        body = {"ids": list(request.ids), "skip_special_tokens": request.skip_special_tokens}
        texts, _ = await self.routes.call(context, rpc, "POST", "/decode", body)
        return pb.DecodeResponse(text=texts[0])

    async def Tokenize(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._tokenize(request, context))

    async def TokenizeStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._tokenize(
                r, context, "tei.v1.Tokenize/TokenizeStream"), context):
            yield answer

    async def Decode(self, request, context):  # noqa: N802
        return await _unary(context, lambda: self._decode(request, context))

    async def DecodeStream(self, request_iterator, context):  # noqa: N802
        async for answer in _ordered(request_iterator, lambda r: self._decode(
                r, context, "tei.v1.Tokenize/DecodeStream"), context):
            yield answer


class APIKeyInterceptor(grpc.aio.ServerInterceptor):
    """--api-key: tei.v1 calls need metadata `authorization: Bearer KEY`; the health and
    reflection services stay open (as TEI's server)."""

    def __init__(self, api_key: str):
        self._expected = f"Bearer {api_key}".encode()

    async def intercept_service(self, continuation, details):
        if not details.method.startswith("/tei.v1."):
            return await continuation(details)
        supplied = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                supplied = value.encode() if isinstance(value, str) else value
        # Constant time, as the HTTP check.
        if hmac.compare_digest(supplied, self._expected):
            return await continuation(details)
        message = ("Missing API key: send metadata 'authorization: Bearer <key>'."
                   if not supplied else "Invalid API key in metadata 'authorization'.")
        handler = await continuation(details)
        return _refusal(handler, message)


def _refusal(handler, message: str):
    """A handler of the same shape (unary or streaming) that answers UNAUTHENTICATED."""
    async def abort(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover (an async generator that never yields)

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(abort, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    return grpc.stream_stream_rpc_method_handler(abort_stream, **kwargs)


def _serving_services(kind: str) -> set[str]:
    """The model-dependent services a model of TEI's `kind` answers (as TEI reports health):
    an embedder Embed, a classifier Predict, a reranker Predict and Rerank."""
    return {"embedding": {"tei.v1.Embed"}, "classifier": {"tei.v1.Predict"},
            "reranker": {"tei.v1.Predict", "tei.v1.Rerank"}}[kind]


async def start_grpc_server(app, host: str, port: int):
    """Serve tei.v1 (plus health and reflection) for `app` on host:port in the running event
    loop; sets app.state.grpc_port (the real port when 0 was asked for). Returns an async
    stop function."""
    state = app.state.pooler
    interceptors = [APIKeyInterceptor(state.settings.api_key)] if state.settings.api_key \
        else []
    server = grpc.aio.server(interceptors=interceptors)
    service = TEIService(app)
    for add in (pb_grpc.add_InfoServicer_to_server, pb_grpc.add_EmbedServicer_to_server,
                pb_grpc.add_PredictServicer_to_server, pb_grpc.add_RerankServicer_to_server,
                pb_grpc.add_TokenizeServicer_to_server):
        add(service, server)
    health_service = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_service, server)
    names = [pb.DESCRIPTOR.services_by_name[n].full_name
             for n in ("Info", "Embed", "Predict", "Rerank", "Tokenize")]
    reflection.enable_server_reflection(
        names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME], server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if bound == 0:
        raise ValueError(f"cannot listen for gRPC on {address}: the port is taken or the "
                         "address is not this machine's; pick another with --grpc-port.")
    app.state.grpc_port = bound
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    model_services = _serving_services(tei.model_kind(state))
    await health_service.set("", serving)
    for name in names:
        model_dependent = name in ("tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank")
        await health_service.set(name, serving if not model_dependent or name in
                                 model_services else not_serving)
    await server.start()
    logger.info("TEI gRPC API on %s:%d (tei.v1, health, reflection)", host, bound)

    async def stop():
        await health_service.enter_graceful_shutdown()
        await server.stop(_GRACE_SECONDS)

    return stop
