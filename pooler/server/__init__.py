"""pooler's HTTP server, laid out by concern.

- the core, here: `app.py` (the app factory), `state.py` (what every handler shares),
  `settings.py` (limits and names, importable without the web stack), `protocol.py` (request
  and response bodies), `errors.py` (the error shape), `openapi_spec.py`, `asgi_call.py` and
  `multi_model.py` (several models behind one router);
- `dialects/`: the HTTP APIs served: vLLM's, TEI's, OpenAI's, Cohere's and pooler's own;
- `grpc/`: TEI's gRPC API, over the TEI routes (stubs generated from tei.proto in generated/);
- `observability/`: Prometheus metrics (pooler's and the peers' names), traces, JSON logs;
- `edges/`: what guards the routes: limits and admission, connection limits, shutdown, auth,
  invalid text.
"""
