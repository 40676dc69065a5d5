"""Seeded random PEFT LoRA adapters on tiny seeded models, and their reference: peft's merged
model (merge_and_unload) saved as a plain model folder, for parity tests and the LoRA bench."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                   "merges.txt", "special_tokens_map.json")
ST_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling", "2_Normalize")


def save_lora(base: Path, dest: Path, cls_name: str, seed: int, **lora_kwargs) -> Path:
    """A LoRA adapter on the model at `base` (loaded as transformers' `cls_name`) with every
    LoRA weight drawn at random (seeded), saved by peft's save_pretrained. Saved
    modules_to_save copies are perturbed too, so a head the adapter replaces differs (0.1: updates the size of the base weights)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    model = getattr(transformers, cls_name).from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(**lora_kwargs))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    peft_model.save_pretrained(dest)
    return dest


def save_merged(base: Path, adapter: Path, dest: Path, cls_name: str) -> Path:
    """peft's merged model (the adapter folded into the base weights) saved as a model folder
    with the base's tokenizer and sentence-transformers modules."""
    import transformers
    from peft import PeftModel

    model = getattr(transformers, cls_name).from_pretrained(base)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    merged.save_pretrained(dest)
    for name in TOKENIZER_FILES + ST_FILES:
        src = base / name
        if src.is_dir():
            shutil.copytree(src, dest / name, dirs_exist_ok=True)
        elif src.is_file():
            shutil.copy(src, dest / name)
    return dest
