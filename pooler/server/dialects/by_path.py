"""Which protocol a path speaks, for answers written before routing (a middleware's 401, the
queue gate's 503/429 in pooler/server/edges/refusals.py).

Each API family's routes are built with its own route class (VLLMRoute, TEIRoute, CohereRoute),
which names its dialect in a `dialect` class attribute; plain routes speak the OpenAI/pooler
shape. A middleware that answers before the route runs looks the request up in the app's route
table and shapes its error as that route would have.
"""
from __future__ import annotations

from typing import Literal

Dialect = Literal["openai", "vllm", "tei", "cohere"]
# Paths on a router of another family that answer in their own shape: TEI's OpenAI alias
# /embeddings lives on the vLLM router (it shares the /v1/embeddings handler) but speaks TEI.
_PATH_DIALECTS: dict[str, Dialect] = {"/embeddings": "tei"}


def route_dialects(routes) -> dict[str, Dialect]:
    """{path: dialect} for every route in an app's route table, first route of a path winning
    as in routing. Routers included with include_router may sit behind a wrapper that keeps
    the original router (newer FastAPI): its routes are read through it, with its prefix."""
    table: dict[str, Dialect] = {}
    for prefix, route in _flat(routes, ""):
        path = getattr(route, "path", None)
        if path is not None:
            path = prefix + path
            table.setdefault(path, _PATH_DIALECTS.get(path, getattr(route, "dialect", "openai")))
    return table


def _flat(routes, prefix: str):
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from _flat(inner.routes, prefix + (getattr(context, "prefix", "") or ""))
        else:
            yield prefix, route


def error_payload(dialect: Dialect, status: int, message: str, kind: str,
                  openai_code: str | None = None) -> dict:
    """An error body in the dialect's shape. `kind` is the short error kind TEI and vLLM name
    ("Unauthorized"); the OpenAI shape keeps pooler's machine-readable `openai_code`."""
    from pooler.server.dialects.vllm.errors import vllm_error_body
    from pooler.server.errors import error_body

    if dialect == "vllm":
        return vllm_error_body(status, message)
    if dialect == "tei":
        return {"error": message, "error_type": kind}
    if dialect == "cohere":
        return {"message": message}
    return error_body(status, message, None, openai_code)
