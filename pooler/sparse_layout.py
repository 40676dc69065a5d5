"""What a sentence-transformers SparseEncoder folder declares about SPLADE.

Three layouts are read:
- a plain *ForMaskedLM folder (no modules.json): SPLADE with max pooling and relu, as
  sentence-transformers builds it (MLMTransformer + SpladePooling);
- `modules.json` = MLMTransformer + SpladePooling: the SpladePooling config says the pooling
  strategy (max | sum) and activation (relu | log1p_relu);
- `modules.json` = one Router (inference-free SPLADE): the "document" route is
  MLMTransformer + SpladePooling in its own folder, the "query" route a SparseStaticEmbedding,
  i.e. one static weight per vocabulary token (IDF-like) and no forward pass at query time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pooler.model_folder import read_json

SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


@dataclass
class SpladeLayout:
    declared: bool = False            # the folder names a SpladePooling module
    pooling: str = "max"              # "max" | "sum" over the tokens of a text
    activation: str = "relu"          # "relu" | "log1p_relu" (applied before log1p)
    transformer_path: Path | None = None   # folder holding the MLM (config.json, weights)
    query_static_path: Path | None = None  # SparseStaticEmbedding folder, inference-free query
    default_route: str | None = None


def _short_type(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def _read_pooling(layout: SpladeLayout, folder: Path) -> None:
    config = read_json(folder / "config.json") or {}
    layout.declared = True
    layout.pooling = config.get("pooling_strategy", "max")
    layout.activation = config.get("activation_function", "relu")
    if layout.pooling not in SPLADE_POOLINGS:
        raise ValueError(f"{folder}: pooling_strategy must be one of {list(SPLADE_POOLINGS)}, "
                         f"got {layout.pooling!r}.")
    if layout.activation not in SPLADE_ACTIVATIONS:
        raise ValueError(f"{folder}: activation_function must be one of "
                         f"{list(SPLADE_ACTIVATIONS)}, got {layout.activation!r}.")


def _read_route(layout: SpladeLayout, root: Path, entries: list[tuple[str, Path]]) -> None:
    """entries: (module type, folder) of one pipeline (top-level or a Router route)."""
    for module_type, folder in entries:
        if module_type in ("MLMTransformer", "Transformer"):
            layout.transformer_path = folder
        elif module_type == "SpladePooling":
            _read_pooling(layout, folder)


def read_splade_layout(root: Path) -> SpladeLayout:
    layout = SpladeLayout(transformer_path=root)
    modules = read_json(root / "modules.json")
    if modules is None:
        return layout
    entries = [(_short_type(m["type"]), root / m.get("path", ""))
               for m in sorted(modules, key=lambda m: m.get("idx", 0))]
    if not any(t == "Router" for t, _ in entries):
        _read_route(layout, root, entries)
        return layout
    router_folder = next(folder for t, folder in entries if t == "Router")
    config = read_json(router_folder / "router_config.json")
    if config is None:
        raise ValueError(f"{router_folder} has a Router module but no router_config.json.")
    types = {name: _short_type(t) for name, t in config.get("types", {}).items()}
    structure: dict[str, list[str]] = config.get("structure", {})
    layout.default_route = (config.get("parameters") or {}).get("default_route")
    document = structure.get("document")
    if document is None:
        raise ValueError(f"{router_folder}: a Router needs a 'document' route for SPLADE; "
                         f"found routes {sorted(structure)}.")
    _read_route(layout, root, [(types[n], router_folder / n) for n in document])
    query = structure.get("query")
    if query is not None and query != document:
        query_types = [types[n] for n in query]
        if query_types != ["SparseStaticEmbedding"]:
            raise ValueError(f"{router_folder}: unsupported query route {query_types}; pooler "
                             "supports an inference-free query route of one "
                             "SparseStaticEmbedding, or the document route itself.")
        layout.query_static_path = router_folder / query[0]
    return layout


def router_transformer_path(root: Path) -> Path:
    """The folder with the MLM weights: the Router's document route, else the folder itself."""
    if not (root / "config.json").is_file() and (root / "router_config.json").is_file():
        path = read_splade_layout(root).transformer_path
        if path is not None:
            return path
    return root
