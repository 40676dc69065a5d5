"""pooler: one engine for embedding, reranking, ColBERT, token-classification and SPLADE models."""
from pooler.engine.llm import Engine
from pooler.outputs import (ClassificationOutput, EmbeddingOutput, Entity, PoolingOutput,
                            TokenClassificationOutput, TokenEmbeddingOutput)
from pooler.params import LateInteractionParams, PoolingParams

__all__ = ["Engine", "EmbeddingOutput", "PoolingOutput", "TokenEmbeddingOutput",
           "ClassificationOutput", "TokenClassificationOutput", "Entity",
           "PoolingParams", "LateInteractionParams"]
__version__ = "0.1.0"
