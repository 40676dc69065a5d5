"""Tiny seeded CLIP / SigLIP / SigLIP2 folders saved by transformers (model.safetensors,
config.json, preprocessor_config.json) with a small word-level tokenizer.json."""
from __future__ import annotations

import json
from pathlib import Path

WORDS = ("a photo of the cat dog red blue car tree house sky sea small big green one two "
         "three on in with and under over running sleeping bird fish").split()


def save_word_tokenizer(dst: Path, *, bos: str | None, eos: str, pad: str,
                        max_length: int, lowercase: bool = True) -> dict[str, int]:
    """A whitespace word-level tokenizer: [bos] words eos, as CLIP's (bos, eos) and SigLIP's
    (eos only) tokenizers frame a text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = [t for t in dict.fromkeys([bos, eos, pad, "<unk>"]) if t]
    vocab = {t: i for i, t in enumerate(specials + list(WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    single = f"{bos} $A {eos}" if bos else f"$A {eos}"
    special_ids = [(t, vocab[t]) for t in (bos, eos) if t]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special_ids)
    tok.save(str(dst / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "eos_token": eos, "pad_token": pad, "unk_token": "<unk>"}
    if bos:
        config["bos_token"] = bos
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return vocab


def save_tiny_clip(dst: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    vocab = save_word_tokenizer(dst, bos="<|startoftext|>", eos="<|endoftext|>",
                                pad="<|endoftext|>", max_length=16)
    torch.manual_seed(seed)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2,
                         max_position_embeddings=16, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=24)
    config.architectures = ["CLIPModel"]
    model = transformers.CLIPModel(config).eval()
    _randomize_norms(model)
    model.save_pretrained(dst)
    transformers.CLIPImageProcessorPil(size={"shortest_edge": 32},
                                       crop_size={"height": 32, "width": 32}).save_pretrained(dst)
    return dst


def save_tiny_siglip(dst: Path, seed: int = 0, version: int = 1) -> Path:
    import torch
    import transformers

    dst.mkdir(parents=True, exist_ok=True)
    vocab = save_word_tokenizer(dst, bos=None, eos="</s>", pad="<pad>", max_length=12)
    torch.manual_seed(seed)
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=12,
                pad_token_id=vocab["<pad>"], eos_token_id=vocab["</s>"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, patch_size=8)
    if version == 1:
        config = transformers.SiglipConfig(text_config=text,
                                           vision_config={**vision, "image_size": 32})
        config.architectures = ["SiglipModel"]
        model = transformers.SiglipModel(config).eval()
        processor = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    else:
        config = transformers.Siglip2Config(text_config=text,
                                            vision_config={**vision, "num_patches": 16})
        config.architectures = ["Siglip2Model"]
        model = transformers.Siglip2Model(config).eval()
        processor = transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=20)
    _randomize_norms(model)
    model.save_pretrained(dst)
    processor.save_pretrained(dst)
    return dst


def _randomize_norms(model) -> None:
    """Seeded init leaves norms at 1/0 and SigLIP's probe/scale at constants: perturb every
    parameter a little so a misplaced one shows."""
    import torch

    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
