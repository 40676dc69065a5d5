"""Seeded random tiny GLiNER span models saved by the `gliner` package itself (save_pretrained:
gliner_config.json + weights + the tokenizer with <<ENT>>/<<SEP>> added), on a tiny DeBERTa-v3
backbone (tests/models/deberta_folders.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.models.deberta_folders import V3, build_deberta

# Texts over the backbone tokenizer's corpus (some words it has never seen, some punctuation).
TEXTS = [
    "the quick brown fox jumps over the lazy dog in paris",
    "pooler serves embedding models",
    "fox",
    "disentangled attention scores content and relative position separately, while a feline "
    "rested on a rug and sparse retrieval weighs every vocabulary term of a document in paris",
    "Berlin is in germany; paris is the capital of france (and a cat sat on the mat).",
]
LABELS = ["animal", "city", "capital of a country"]


def build_gliner(folder: Path, seed: int = 0, safetensors: bool = False,
                 **config) -> Path:
    """A GLiNER model on a fresh tiny DeBERTa-v3, perturbed so that span scores spread over
    (0, 1); `config` overrides GLiNERConfig settings (hidden_size, max_width, max_len, ...)."""
    from gliner import GLiNER, GLiNERConfig

    backbone = folder.parent / f"{folder.name}_backbone"
    build_deberta(backbone, "DebertaV2Model", seed=seed, style=V3)
    settings = dict(hidden_size=48, max_width=4, max_len=20, dropout=0.0, span_mode="markerV0")
    settings.update(config)
    torch.manual_seed(seed)
    model = GLiNER.from_config(GLiNERConfig(model_name=str(backbone), **settings),
                               backbone_from_pretrained=True)
    with torch.no_grad():
        for p in model.model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        model.model.prompt_rep_layer[3].weight.mul_(4.0)  # label . span logits of a few units
    model.save_pretrained(folder, safe_serialization=safetensors)
    return folder
