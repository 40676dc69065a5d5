"""vLLM's output encodings for pooled vectors: `embed_dtype` x `endianness`, as base64 text in
the JSON body or as a binary body (`encoding_format` "bytes": the vectors back to back, with a
`metadata` header saying where each one is; "bytes_only": the same body, no header).

A value is cast to the dtype (float32, float16, bfloat16, fp8 e4m3 / e5m2), its raw bytes taken
in the machine's order ("native") or swapped to "little"/"big" endian.
"""
from __future__ import annotations

import base64
import json
import sys
from typing import Any, Literal

import numpy as np
import torch
from fastapi.responses import Response

EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]

EMBED_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# Same-width integer views: their numpy arrays give the raw bytes and can be byte-swapped.
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def to_bytes(array: np.ndarray, embed_dtype: str, endianness: str) -> bytes:
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).flatten()
    cast = tensor.to(EMBED_DTYPES[embed_dtype])
    raw = cast.view(_BIT_VIEWS[cast.element_size()]).numpy()
    if endianness != "native" and endianness != sys.byteorder:
        raw = raw.byteswap()
    return raw.tobytes()


def encode_vector(array: np.ndarray, encoding_format: str, embed_dtype: str = "float32",
                  endianness: str = "native"):
    """One output in a JSON body: a (nested) float list, or base64 of its bytes."""
    if encoding_format == "base64":
        return base64.b64encode(to_bytes(array, embed_dtype, endianness)).decode()
    return np.asarray(array, dtype=np.float32).tolist()


def binary_response(arrays: list[np.ndarray], encoding_format: str, embed_dtype: str,
                    endianness: str, envelope: dict[str, Any]) -> Response:
    """The vectors back to back; with "bytes", a `metadata` header holds the envelope (id,
    created, model, usage) and per output its index, dtype, endianness, byte span and
    shape."""
    chunks, items, offset = [], [], 0
    for index, array in enumerate(arrays):
        chunk = to_bytes(array, embed_dtype, endianness)
        items.append({"index": index, "embed_dtype": embed_dtype, "endianness": endianness,
                      "start": offset, "end": offset + len(chunk),
                      "shape": list(np.shape(array))})
        chunks.append(chunk)
        offset += len(chunk)
    headers = None
    if encoding_format == "bytes":
        headers = {"metadata": json.dumps({**envelope, "data": items})}
    return Response(b"".join(chunks), media_type="application/octet-stream", headers=headers)
