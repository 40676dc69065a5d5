"""Seeded random tiny MPNet / DistilBERT / ELECTRA / CamemBERT / Gemma3 models saved with
transformers' save_pretrained (config.json + model.safetensors + tokenizer), for the parity
tests of tests/models/test_encoder_families.py and test_gemma3.py."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.models.tiny_task_models import copy_minilm_tokenizer, minilm_path

# Task kind -> class name suffix.
SUFFIXES = {"base": "Model", "seq": "ForSequenceClassification",
            "token": "ForTokenClassification"}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _perturb_norms(model: torch.nn.Module) -> None:
    """Random non-trivial norm weights and biases, so a test sees them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)


def _save(model: torch.nn.Module, dest: Path) -> Path:
    _perturb_norms(model)
    model.eval().save_pretrained(dest)
    return dest


def save_mpnet_tokenizer(dest: Path) -> None:
    """MiniLM's WordPiece vocabulary under MPNet's special tokens (<s>=0, <pad>=1, </s>=2),
    saved as the MPNet tokenizer saves itself (tokenizer.json + tokenizer_config.json)."""
    from transformers import MPNetTokenizer

    words = (minilm_path() / "vocab.txt").read_text().splitlines()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = specials + [w for w in words if w not in specials] + ["<mask>"]
    MPNetTokenizer(vocab={w: i for i, w in enumerate(vocab)},
                   model_max_length=512).save_pretrained(dest)


def save_mpnet(dest: Path, kind: str = "base", num_labels: int = 3, seed: int = 0,
               **overrides) -> Path:
    """MPNetModel / MPNetForSequenceClassification / MPNetForTokenClassification."""
    import transformers

    dest.mkdir(parents=True, exist_ok=True)
    save_mpnet_tokenizer(dest)
    vocab_size = len(json.loads((dest / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    config = transformers.MPNetConfig(vocab_size=vocab_size, max_position_embeddings=130,
                                      num_labels=num_labels, initializer_range=0.2,
                                      **{**TINY, **overrides})
    return _save(getattr(transformers, "MPNet" + SUFFIXES[kind])(config), dest)


def add_st_modules(folder: Path, pooling: str, normalize: bool, max_seq_length: int = 128,
                   dense: list[tuple[int, int]] = (), prompts: dict | None = None,
                   seed: int = 0) -> None:
    """Make `folder` a sentence-transformers folder: Transformer, Pooling, optional bias-free
    identity Dense layers (in, out) with seeded weights, optional Normalize; and prompts."""
    from safetensors.torch import save_file

    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}))
    g = torch.Generator().manual_seed(seed)
    for i, (n_in, n_out) in enumerate(dense):
        name = f"{len(modules)}_Dense"
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps({
            "in_features": n_in, "out_features": n_out, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        save_file({"linear.weight": torch.randn(n_out, n_in, generator=g) * n_in ** -0.5},
                  str(folder / name / "model.safetensors"))
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": name,
                        "type": "sentence_transformers.models.Dense"})
    if normalize:
        (folder / f"{len(modules)}_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)),
                        "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": prompts or {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine"}))
