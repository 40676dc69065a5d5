"""pooler: one engine for embedding, reranking, ColBERT, token-classification and SPLADE models."""
from pooler.engine.llm import Engine
from pooler.outputs import EmbeddingOutput, PoolingOutput, TokenEmbeddingOutput
from pooler.params import LateInteractionParams, PoolingParams

__all__ = ["Engine", "EmbeddingOutput", "PoolingOutput", "TokenEmbeddingOutput",
           "PoolingParams", "LateInteractionParams"]
__version__ = "0.1.0"
