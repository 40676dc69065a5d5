"""Seeded random tiny NomicBert / GTE / Jina v3 / EuroBERT folders in the real on-disk format
(transformers' save_pretrained), for the rotary encoder parity tests.

transformers defines these classes from 5.24 on; `require_family` skips a test when the
installed transformers lacks the class.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.modernbert_folders import save_tokenizer

# Mixed lengths, and pairs of different token types for the classifiers.
TEXTS = [
    "the cat",
    "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
    "pooler serves embedding models",
    "modern encoders use rotary position embeddings, a feline rested on a rug",
    "fox",
]

# family -> (config class, base model class, the backbone's attribute in task models)
FAMILIES = {
    "nomic_bert": ("NomicBertConfig", "NomicBertModel"),
    "gte": ("GteConfig", "GteModel"),
    "jina_embeddings_v3": ("JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model"),
    "eurobert": ("EuroBertConfig", "EuroBertModel"),
}
_PREFIX = {"nomic_bert": "NomicBert", "gte": "Gte", "jina_embeddings_v3": "JinaEmbeddingsV3",
           "eurobert": "EuroBert"}


def class_name(family: str, head: str) -> str:
    return _PREFIX[family] + head  # head: "Model", "ForSequenceClassification", ...


def require_family(family: str, head: str = "Model"):
    """The transformers class, or skip: it exists from transformers 5.24."""
    transformers = pytest.importorskip("transformers")
    name = class_name(family, head)
    if not hasattr(transformers, name):
        pytest.skip(f"transformers {transformers.__version__} does not define {name} "
                    "(transformers 5.24 defines it)")
    return getattr(transformers, name)


def family_config(family: str, vocab_size: int, **overrides):
    import transformers

    kwargs = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                  pad_token_id=3, id2label={0: "A", 1: "B", 2: "C"},
                  label2id={"A": 0, "B": 1, "C": 2})
    if family == "eurobert":
        # Grouped-query attention (2 kv heads for 4 query heads), a non-default rotary base.
        kwargs.update(num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    elif family == "nomic_bert":
        kwargs.update(type_vocab_size=2)
    kwargs.update(overrides)
    return getattr(transformers, FAMILIES[family][0])(**kwargs)


def build_family(folder: Path, family: str, head: str = "Model", seed: int = 0, **overrides):
    """Save a seeded random model of `family` (`head`: Model, ForSequenceClassification,
    ForTokenClassification) and its tokenizer to `folder`; return the model in eval mode."""
    model_cls = require_family(family, head)
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = save_tokenizer(folder)
    torch.manual_seed(seed)
    model = model_cls(family_config(family, vocab_size, **overrides))
    with torch.no_grad():  # perturb every tensor (norms too) so a misplaced weight shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model.eval()
