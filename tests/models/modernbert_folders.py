"""Seeded random tiny ModernBERT folders in the real on-disk format (save_pretrained)."""
from __future__ import annotations

from pathlib import Path

import torch

from pooler.bench.modernbert_tokenizer import modernbert_bpe

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "pooler serves embedding models on packed batches",
    "modern encoders use rotary position embeddings and local attention",
    "a feline rested on a rug while the cat sat on the mat",
    "sparse retrieval weighs every vocabulary term of a document",
] * 4

# Mixed lengths; the long ones are far past the local window (local_attention=8 -> 4 each side).
TEXTS = [
    "the cat",
    "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
    "pooler serves embedding models",
    "modern encoders use rotary position embeddings and local attention, "
    "a feline rested on a rug while sparse retrieval weighs every term",
    "fox",
]


def save_tokenizer(folder: Path, model_max_length: int = 128) -> int:
    """A small byte-level BPE with ModernBERT's special tokens and template; returns vocab size."""
    tokenizer = modernbert_bpe(CORPUS, vocab_size=300, model_max_length=model_max_length)
    tokenizer.save_pretrained(folder)
    return tokenizer.backend_tokenizer.get_vocab_size()


def modernbert_config(vocab_size: int, **overrides):
    from transformers import ModernBertConfig

    kwargs = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=4, num_attention_heads=2, local_attention=8,
                  global_attn_every_n_layers=3, max_position_embeddings=128,
                  pad_token_id=3, cls_token_id=1, sep_token_id=2, bos_token_id=1,
                  eos_token_id=2, id2label={0: "A", 1: "B", 2: "C"},
                  label2id={"A": 0, "B": 1, "C": 2})
    kwargs.update(overrides)
    return ModernBertConfig(**kwargs)


def build_modernbert(folder: Path, model_cls_name: str = "ModernBertModel", seed: int = 0,
                     **overrides):
    """Save a seeded random ModernBERT* model and its tokenizer to `folder`; return the model."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = save_tokenizer(folder)
    torch.manual_seed(seed)
    config = modernbert_config(vocab_size, **overrides)
    model = getattr(transformers, model_cls_name)(config)
    with torch.no_grad():  # perturb every tensor (norms too) so a misplaced weight shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model.eval()
