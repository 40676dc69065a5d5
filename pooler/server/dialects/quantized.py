"""Quantized vectors on the server (issue 16): /v1/embeddings, /pooling (embed and token_embed)
and /embed take `precision`, Cohere's /v2/embed its `embedding_types`.

int8 / uint8 codes must not depend on which other texts share a request (an index is built
over many requests), so the server never takes ranges from the batch as the offline
`Engine.embed` does: it uses the request's `ranges` ([2, dim]: per-dimension minimum and
maximum) or, by default, [-1, 1] in every dimension (where a unit vector's components lie),
clipping values outside them.
"""
from __future__ import annotations

import base64

import numpy as np

from pooler.quantize_output import quantize_embeddings
from pooler.server.errors import bad_request

DEFAULT_RANGE = (-1.0, 1.0)


def server_ranges(ranges, dim: int, field: str = "ranges") -> np.ndarray:
    if ranges is None:
        return np.array([[DEFAULT_RANGE[0]] * dim, [DEFAULT_RANGE[1]] * dim], np.float32)
    array = np.asarray(ranges, dtype=np.float32)
    if array.shape != (2, dim):
        raise bad_request(f"'{field}' must be [[min per dimension], [max per dimension]] with "
                          f"{dim} values each, got shape {list(array.shape)}.", field)
    if np.any(array[1] <= array[0]):
        raise bad_request(f"'{field}': every maximum must be above its minimum.", field)
    return array


def quantize(matrix: np.ndarray, precision: str, ranges=None) -> np.ndarray:
    """matrix [n, dim] float32 -> the precision's codes, request-independent."""
    if precision == "float32":
        return matrix
    bounds = server_ranges(ranges, matrix.shape[1]) if precision in ("int8", "uint8") else None
    return quantize_embeddings(matrix, precision, ranges=bounds, clip=True)


def encode(vector: np.ndarray, encoding_format: str):
    """A float32 vector as floats or base64 of little-endian float32; an int8/uint8 one as
    integers or base64 of its raw bytes. A matrix (token_embed: one row per token) comes as
    nested lists, or base64 of its rows back to back."""
    if vector.dtype.kind == "f":
        if encoding_format == "base64":
            return base64.b64encode(np.ascontiguousarray(vector, "<f4").tobytes()).decode()
        return vector.tolist()
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector).tobytes()).decode()
    return vector.tolist()  # Python ints, nested for a matrix


def check_request(precision: str, encoding_format: str, ranges, dim: int | None) -> None:
    """Refuse what cannot be answered before any compute: quantized codes travel as JSON
    integers or base64 only, and ranges must fit the vector size when it is known up front."""
    if precision == "float32":
        return
    if encoding_format not in ("float", "base64"):
        raise bad_request(f"precision={precision!r} takes encoding_format 'float' or "
                          f"'base64', not {encoding_format!r}.", "encoding_format")
    if precision in ("int8", "uint8") and dim is not None:
        server_ranges(ranges, dim)
