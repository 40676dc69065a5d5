"""The simplest server a user would write around sentence-transformers: the baseline that
benchmarks/server_load.py compares `pooler serve` against.

    python benchmarks/st_fastapi_baseline.py MODEL_PATH PORT
"""
import sys

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(sys.argv[1], device="cpu")
app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


@app.post("/v1/embeddings")
def embeddings(request: EmbeddingRequest):  # sync: FastAPI runs it in its thread pool
    texts = [request.input] if isinstance(request.input, str) else request.input
    vectors = model.encode(texts)
    return {"object": "list", "model": "baseline",
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                     for i, v in enumerate(vectors)]}


@app.get("/health")
def health():
    return {"status": "ok"}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
