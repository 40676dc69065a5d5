"""pooler's late-chunking route: POST /embed_chunks -> one vector per chunk of a document,
pooled from the token states of the whole document (Engine.embed_chunks)."""
from __future__ import annotations

import time
import uuid
from typing import Literal, Optional

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from pooler.engine.long_inputs import check_overlap
from pooler.server.errors import ERROR_RESPONSES, bad_request
from pooler.server.protocol import NullMeansUnset, StrictInt  # JSON integers: 5 and 5.0
from pooler.server.state import ServerState

router = APIRouter(tags=["pooler"])


class EmbedChunksRequest(NullMeansUnset):
    model_config = ConfigDict(extra="forbid")
    document: StrictStr = Field(description=(
        "The text to chunk: not blank (a 400). Sentences with no token (only characters the "
        "tokenizer drops) are left out, so such a document has no chunks (`data` is empty)."))
    model: Optional[StrictStr] = None
    # (start, end) character spans; without them the document is cut into sentences.
    chunks: Optional[list[tuple[StrictInt, StrictInt]]] = None
    chunker: Literal["sentences"] = "sentences"
    normalize: Optional[StrictBool] = None
    dimensions: Optional[StrictInt] = None
    window_overlap: Optional[StrictInt] = None


class ChunkEmbedding(BaseModel):
    index: int
    object: Literal["chunk_embedding"] = "chunk_embedding"
    start: int
    end: int
    text: str
    embedding: list[float]


class EmbedChunksResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ChunkEmbedding]
    usage: dict[str, int]


@router.post("/embed_chunks", response_model=EmbedChunksResponse, responses=ERROR_RESPONSES)
async def embed_chunks(body: EmbedChunksRequest, request: Request):
    """Late chunking: the document is encoded once (in overlapping windows past the model's
    max length) and each chunk's vector is the mean of its tokens' vectors, so every chunk
    carries the context of the whole document."""
    state: ServerState = request.app.state.pooler
    state.check_model(body.model)
    state.require("embed_chunks", "token_embed", "late chunking")
    state.check_dimensions(body.dimensions)
    if not body.document.strip():
        raise bad_request("'document' is blank: pass text to chunk.", "document")
    if body.window_overlap is not None:
        _check_window_overlap(state, body.window_overlap)

    def compute():
        chunks = state.call("embed_chunks", body.document,
                            [tuple(c) for c in body.chunks] if body.chunks is not None else None,
                            chunker=body.chunker, normalize=body.normalize,
                            dimensions=body.dimensions, window_overlap=body.window_overlap,
                            use_tqdm=False)
        data = [{"index": i, "object": "chunk_embedding", "start": c.start, "end": c.end,
                 "text": c.text, "embedding": c.embedding.tolist()}
                for i, c in enumerate(chunks)]
        # The engine's own count (no second tokenization); a document whose sentences have no
        # token has no chunks: its special tokens alone.
        tokens = chunks[0].document_tokens if chunks else \
            state.engine.tokenizer.num_special_tokens_to_add(pair=False)
        return {"id": f"chunks-{uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": state.model_name, "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return await state.respond(request, 1, "document", compute)


def _check_window_overlap(state: ServerState, overlap: int) -> None:
    """400 naming window_overlap before any work is admitted (the engine's own check)."""
    engine = state.engine
    try:
        specials = engine.tokenizer.num_special_tokens_to_add(pair=False)
        check_overlap(overlap, engine.model_config.max_model_len, specials, "window_overlap")
    except ValueError as exc:
        raise bad_request(str(exc), "window_overlap") from None
