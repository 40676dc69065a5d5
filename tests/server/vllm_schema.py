"""vLLM's response bodies as pydantic models, written from the field names and types of vLLM's
published protocol (vllm/entrypoints/pooling/{embed,pooling,classify,scoring}/protocol.py,
serve/tokenize, the OpenAI-style ErrorResponse). vllm itself cannot be installed here (it pulls a CUDA torch), so
the translated tests validate against these.

Also: decoding vLLM's binary ("bytes") bodies and base64 vectors of any embed_dtype and
endianness, the way vLLM's client-side helpers do.
"""
from __future__ import annotations

import base64
import json
import sys
from typing import Optional, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class UsageInfo(_Model):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0


class EmbeddingResponseData(_Model):
    index: int
    object: str = "embedding"
    embedding: Union[list[float], str]


class EmbeddingResponse(_Model):
    id: str
    object: str = "list"
    created: int
    model: Optional[str] = None
    data: list[EmbeddingResponseData]
    usage: UsageInfo


class PoolingResponseData(_Model):
    index: int
    object: str = "pooling"
    data: Union[list[list[float]], list[float], str]


class PoolingResponse(_Model):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo


class ClassificationData(_Model):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(_Model):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreResponseData(_Model):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(_Model):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankDocument(BaseModel):
    text: Optional[str] = None
    multi_modal: Optional[list] = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument  # required in vLLM's model
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(_Model):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class MetadataItem(BaseModel):
    index: int
    embed_dtype: str
    endianness: str
    start: int
    end: int
    shape: list[int]


EMBED_DTYPES = {"float32": (torch.float32, np.float32), "float16": (torch.float16, np.float16),
                "bfloat16": (torch.bfloat16, np.int16),
                "fp8_e4m3": (torch.float8_e4m3fn, np.uint8),
                "fp8_e5m2": (torch.float8_e5m2, np.uint8)}
ENDIANNESS = ("native", "little", "big")


def decode_binary(raw: bytes, shape, embed_dtype: str, endianness: str) -> np.ndarray:
    """Bytes of one output -> float32 array (the inverse of vLLM's tensor2binary)."""
    torch_dtype, np_view = EMBED_DTYPES[embed_dtype]
    array = np.frombuffer(raw, dtype=np_view).reshape(shape)
    if endianness != "native" and endianness != sys.byteorder:
        array = array.byteswap()
    return torch.from_numpy(array.copy()).view(torch_dtype).to(torch.float32).numpy()


def decode_bytes_body(body: bytes, items: list[MetadataItem]) -> list[np.ndarray]:
    return [decode_binary(body[i.start:i.end], tuple(i.shape), i.embed_dtype, i.endianness)
            for i in sorted(items, key=lambda i: i.index)]


def decode_base64(text: str, embed_dtype: str, endianness: str) -> np.ndarray:
    return decode_binary(base64.b64decode(text), (-1,), embed_dtype, endianness)


def metadata_of(response) -> tuple[dict, list[MetadataItem]]:
    meta = json.loads(response.headers["metadata"])
    return meta, [MetadataItem(**x) for x in meta["data"]]
