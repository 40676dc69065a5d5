"""pooler: one engine for embedding, reranking, ColBERT, token-classification and SPLADE models.

The public names load on first use (PEP 562), so importing pooler loads no torch and can set the
OpenMP spin (pooler/cpu_threads.py) first: OpenMP reads it once, when torch loads."""
from __future__ import annotations

import importlib
import sys

if "torch" not in sys.modules:
    from pooler.cpu_threads import prefer_short_openmp_spin
    prefer_short_openmp_spin()

# Public name -> the module that defines it.
_EXPORTS = {
    "Engine": "pooler.engine.llm",
    "EmbeddingOutput": "pooler.outputs", "PoolingOutput": "pooler.outputs",
    "TokenEmbeddingOutput": "pooler.outputs", "ClassificationOutput": "pooler.outputs",
    "TokenClassificationOutput": "pooler.outputs", "Entity": "pooler.outputs",
    "PoolingParams": "pooler.params", "LateInteractionParams": "pooler.params",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pooler' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
