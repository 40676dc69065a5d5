"""No text can crash a route: a JSON string holding a lone UTF-16 surrogate ("a\\ud800b") is a
400 naming the field, on every route, before any handler runs.

Python's json accepts such escapes and yields a str that is not valid Unicode; the
tokenizer then raised a TypeError (a 500). TEI rejects these bodies too (serde_json refuses a
lone surrogate escape, answering 422); vLLM passes them to its tokenizer and fails like we
did. We reject rather than clean: replacing the character would embed a text other than the
one sent, silently. Valid surrogate pairs (how `json.dumps` escapes emoji) are decoded into
one character by json and pass.

Only bodies containing a `\\uD8xx`-`\\uDFxx` escape (or a surrogate's raw UTF-8 bytes) are
parsed a second time, so ordinary requests pay one byte scan.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pooler.server.edges.auth import send_json
from pooler.server.errors import error_body

# A surrogate as a JSON escape, or as raw (invalid) UTF-8 bytes, which json.loads also lets
# through (it decodes bytes with "surrogatepass").
_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf][\x80-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(value: Any, path: tuple = ()) -> tuple[tuple, str, int] | None:
    """(path to the string, the string, index of the surrogate) of the first string (or
    object key) in a parsed JSON value that holds a lone surrogate, else None."""
    if isinstance(value, str):
        match = _SURROGATE.search(value)
        return (path, value, match.start()) if match else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = (find_lone_surrogate(key, path + (key,)) if isinstance(key, str) else None) \
                or find_lone_surrogate(item, path + (key,))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_lone_surrogate(item, path + (i,))
            if found:
                return found
    return None


def lone_surrogate_error(body: bytes) -> dict | None:
    """The 400 body for a JSON request body with a lone surrogate in some string, else None
    (also None for bodies that are not JSON: the route's validation reports those)."""
    if not _SURROGATE_BYTES.search(body):
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    found = find_lone_surrogate(parsed)
    if found is None:
        return None
    path, text, index = found
    where = ".".join(str(p) for p in path) or "body"
    field = str(path[0]) if path else None
    message = (f"Invalid '{where}': the text has a lone UTF-16 surrogate "
               f"(U+{ord(text[index]):04X} at character {index}), which is not valid Unicode. "
               "Send valid text: pair the surrogate or remove it.")
    return error_body(400, message, field, "invalid_text")


class InvalidTextMiddleware:
    """Pure ASGI, inside PayloadLimitMiddleware (which hands over the whole body in one
    message): answer 400 for a lone surrogate, else replay the body to the app."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        message = await receive()
        if message["type"] != "http.request":
            return await self.app(scope, _replay(message, receive), send)
        chunks = [message.get("body", b"")]
        while message.get("more_body", False):  # not after PayloadLimitMiddleware, but safe
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left mid-body
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
        error = lone_surrogate_error(body)
        if error is not None:
            return await send_json(send, 400, error)
        return await self.app(scope, _replay({"type": "http.request", "body": body,
                                              "more_body": False}, receive), send)


def _replay(first: dict, receive):
    replayed = False

    async def replay():
        nonlocal replayed
        if not replayed:
            replayed = True
            return first
        return await receive()

    return replay
