"""The simplest server a user would write around sentence-transformers: the peer of the
`server` workload (pooler/bench/workloads/server.py).

    python -m pooler.bench.st_fastapi_app MODEL_PATH PORT [THREADS]
"""
import sys

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

if len(sys.argv) > 3:
    torch.set_num_threads(int(sys.argv[3]))
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
