"""pooler's long documents on every dialect's scoring routes (Engine.score long_input): the
options a body passes on, and the window count a chunked result carries."""
from __future__ import annotations

from typing import Any


def long_document_options(body) -> dict[str, Any]:
    """pooler's long_input / chunk_overlap / chunk_aggregate as Engine.score takes them: the
    chunk options only with long_input "chunk" (without it they change nothing, as
    chunk_overlap on /v1/embeddings)."""
    if body.long_input != "chunk":
        return {}
    return {name: getattr(body, name) for name in ("long_input", "chunk_overlap",
                                                   "chunk_aggregate")
            if getattr(body, name) is not None}


def with_windows(item: dict[str, Any], output) -> dict[str, Any]:
    """pooler's num_windows on a result, only when its document was chunked."""
    if output.num_windows is not None:
        item["num_windows"] = int(output.num_windows)
    return item
