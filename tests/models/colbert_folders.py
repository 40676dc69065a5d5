"""Build ColBERT model folders in their real on-disk formats for tests.

- PyLate layout: written by hand as PyLate 1.6 saves `models.ColBERT(<backbone>,
  embedding_size=...)` (pooler/bench/pylate_folder.py, shared with `pooler bench`).
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

from pooler.bench.common import minilm_path
from pooler.bench.pylate_folder import PYLATE_SETTINGS, build_pylate  # noqa: F401 (re-export)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")

STANFORD_METADATA = {
    # What colbert-ir's ColBERTConfig writes (the keys pooler reads, plus typical others).
    "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]",
    "doc_token": "[D]", "query_maxlen": 32, "doc_maxlen": 180, "mask_punctuation": True,
    "attend_to_mask_tokens": False, "similarity": "cosine", "dim": 96, "interaction": "colbert",
    "checkpoint": "bert-base-uncased", "nbits": 2, "kmeans_niters": 4,
}


def weights_fingerprint(folder: Path) -> str:
    """sha256 over every tensor of the folder's safetensors files (names, shapes, bytes): the
    pre-computed references name the folder they were made from by it."""
    import hashlib

    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for file in sorted(folder.rglob("*.safetensors")):
        for name, tensor in sorted(load_file(str(file)).items()):
            digest.update(f"{file.relative_to(folder)}:{name}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


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


def build_stanford_from_minilm(dest: Path, dim: int = 32, **kwargs) -> Path:
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


# The texts of the ColBERT parity tests, and the folders PyLate's pre-computed outputs cover
# (tests/references/pylate_colbert.npz, made by tests/references/make_pylate_references.py).
PARITY_QUERIES = ["what is the capital of france?", "cats",
                  "how do ColBERT models score documents against a query, token by token?"]
PARITY_DOCS = ["Paris is the capital of France.", "The cat sat on the mat, happily!", "x",
               "ColBERT encodes queries and documents into token vectors; MaxSim sums, over "
               "query tokens, the best match in the document. (Late interaction.) " * 3]


def parity_folders(root: Path) -> dict[str, Path]:
    """The ColBERT parity folders: PyLate's layout with its defaults, attending to expansion
    tokens with short lengths, without expansion or skiplist; and the Stanford layout."""
    pylate = build_pylate(root / "pylate")
    return {
        "pylate": pylate,
        "pylate_attend": variant(pylate, root / "pylate_attend", st_config={
            "attend_to_expansion_tokens": True, "query_length": 12, "document_length": 16}),
        "pylate_noexp": variant(pylate, root / "pylate_noexp", st_config={
            "do_query_expansion": False, "skiplist_words": [], "query_prefix": ""}),
        "stanford": build_stanford_from_minilm(root / "stanford"),
    }


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
