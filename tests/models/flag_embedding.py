"""FlagEmbedding's BGEM3FlagModel, the BGE-M3 reference, on current transformers.

FlagEmbedding 1.4.2 (the newest release) imports every model it has from its package
`__init__`, among them a MiniCPM reranker that needs `transformers.modeling_attn_mask_utils`,
a module transformers 5.2x no longer has. BGEM3FlagModel itself needs none of it. When the
plain import fails for that reason, the M3 module is imported with its parent packages
registered as bare namespaces, so their `__init__`s (and the reranker) never run.
"""
from __future__ import annotations

import importlib.util
import sys
import types

_PARENTS = ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder",
            "FlagEmbedding.inference.embedder.encoder_only")


def bge_m3_flag_model_class():
    """The BGEM3FlagModel class (pytest skips when FlagEmbedding is not installed)."""
    import pytest

    if importlib.util.find_spec("FlagEmbedding") is None:
        pytest.skip("FlagEmbedding is not installed (the Makefile installs it --no-deps)")
    try:
        from FlagEmbedding import BGEM3FlagModel
        return BGEM3FlagModel
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("transformers"):
            raise
    for name in [m for m in sys.modules if m == "FlagEmbedding" or
                 m.startswith("FlagEmbedding.")]:
        del sys.modules[name]  # the half-imported package from the attempt above
    root = importlib.util.find_spec("FlagEmbedding").submodule_search_locations[0]
    for name in _PARENTS:
        package = types.ModuleType(name)
        package.__path__ = [root + name[len("FlagEmbedding"):].replace(".", "/")]
        sys.modules[name] = package
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder
    return M3Embedder
