"""Model shapes `pooler bench --model NAME` builds with seeded random weights, so a bench table
at a real model's size runs without a hub download.

Each is a BertModel of the named shape saved as a sentence-transformers folder (mean pooling +
Normalize) with bert-base-uncased's WordPiece tokenizer (copied from the bundled
all-MiniLM-L6-v2, which uses it): pooler, sentence-transformers and the ONNX Runtime peers
(pooler/bench/onnx_peer.py) all load it as they would the real model, and the per-token compute
is the real model's (the outputs are not meaningful; the match column still compares sides).
Imports nothing heavy at module level: the CLI names the shapes in `pooler bench --help`.
Built once under the bench cache (common.cached_folder); with --quick the tiny variant (every
structural setting kept, widths and depth shrunk: arch_folders._sizes) is built instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ShapeModel:
    name: str
    description: str
    shape: dict = field(default_factory=dict)  # BertConfig sizes
    cache_name: str = ""     # the bench cache folder (size and seed appended)


SHAPE_MODELS: dict[str, ShapeModel] = {m.name: m for m in (
    # The arch workload's "bert" row is this same folder (arch_folders.ARCH_MODELS["bert"]).
    ShapeModel("bert-base", "BERT-base: 12 layers x 768, 12 heads, FFN 3072 (bert-base-uncased, "
               "bge-base-en-v1.5, e5-base-v2 shape), 110M parameters",
               dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072), cache_name="arch-bert"),
    ShapeModel("bert-large", "BERT-large: 24 layers x 1024, 16 heads, FFN 4096 "
               "(bge-large-en-v1.5, e5-large-v2 shape), 335M parameters",
               dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                    intermediate_size=4096), cache_name="shape-bert-large"),
)}


def shape_folder(name: str, tiny: bool) -> Path:
    """The sentence-transformers folder of shape `name`, built once per size."""
    from pooler.bench.arch_folders import bert_builder
    from pooler.bench.common import cached_folder

    model = SHAPE_MODELS[name]
    return cached_folder(f"{model.cache_name}-{'tiny' if tiny else 'base'}-seed0",
                         lambda dest: bert_builder(**model.shape)(dest, tiny))


def shape_names_line() -> str:
    return ", ".join(SHAPE_MODELS)


def resolve_bench_model(model: str, tiny: bool) -> str:
    """--model as the bench's sides load it: a shape name (unless a folder of that name exists)
    becomes its built folder; a folder, an installed model package or a hub id ORG/NAME is
    kept. Anything else raises the model resolver's error, naming the shapes too."""
    if Path(model).expanduser().is_dir():
        return model
    if model in SHAPE_MODELS:
        return str(shape_folder(model, tiny))
    from pooler.model_folder import _is_repo_id, resolve_model_path

    if not _is_repo_id(model):
        try:
            resolve_model_path(model)  # an installed model package, or the error
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"--model: {exc} pooler bench also builds these shapes "
                                    f"with seeded weights: {shape_names_line()}.") from None
    return model
