"""The HTTP APIs the server speaks, one module (or subpackage) per dialect.

- `vllm/`: vLLM's pooling routes (routes.py: /v1/embeddings, /pooling, /classify, /score,
  /tokenize, ...), scoring (rerank.py), LoRA adapters (lora.py), chat `messages` (chat.py),
  their bodies (protocol.py), errors (errors.py) and vector encodings (encoding.py);
- `tei.py`: text-embeddings-inference's routes; `cohere.py`: Cohere's embed API;
  `openai.py`: GET /v1/models;
- `native/`: pooler's own routes: /ner, /embed_chunks (late chunking), BGE-M3's outputs;
- `quantized.py`: quantized vectors, shared by the dialects that return them;
- `by_path.py`: which dialect a path speaks, for answers written before routing.
"""
