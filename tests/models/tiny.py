"""Seeded random tiny models saved in the real on-disk format, for parity tests."""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)


def save_tiny_bert(dst: Path, tokenizer_src: Path, *, kind: str = "bert", seed: int = 0,
                   architecture: str = "BertModel", **overrides) -> Path:
    """A 2-layer random BERT or XLM-RoBERTa with MiniLM's vocabulary, saved with
    transformers' save_pretrained (model.safetensors + config.json)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128)
    common.update(overrides)
    if kind == "bert":
        config = transformers.BertConfig(**common)
    elif kind == "xlm-roberta":
        config = transformers.XLMRobertaConfig(pad_token_id=1, type_vocab_size=1,
                                               **{**common, "max_position_embeddings": 130})
    else:
        raise ValueError(kind)
    config.architectures = [architecture]
    model = getattr(transformers, architecture)(config).eval()
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    copy_tokenizer(tokenizer_src, dst)
    return dst


def add_st_pooling(folder: Path, mode: str, normalize: bool = False,
                   dimension: int | None = None) -> None:
    """Make the folder a sentence-transformers model with the given pooling mode (dimension:
    the hidden size, when config.json names it otherwise)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    if dimension is None:
        dimension = json.loads((folder / "config.json").read_text())["hidden_size"]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dimension,
        "pooling_mode_cls_token": mode == "cls", "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": mode == "max", "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
