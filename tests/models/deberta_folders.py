"""Seeded random tiny DeBERTa / DeBERTa-v2/v3 folders in the real on-disk format.

The tokenizer is transformers' own DebertaV2Tokenizer (Unigram + Metaspace, [CLS] $A [SEP]
template) over a vocabulary trained here, saved with save_pretrained as DeBERTa-v3 folders on
the hub have it (tokenizer.json + tokenizer_config.json). Relative-position settings are scaled
down (position_buckets=8, max_relative_positions=24) so that the test texts, up to ~60 tokens,
reach both the log buckets and the clamp at the table's edge.
"""
from __future__ import annotations

from pathlib import Path

import torch

from pooler.bench.deberta_tokenizer import unigram_deberta_tokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "pooler serves embedding models on packed batches",
    "disentangled attention scores content and relative position separately",
    "a feline rested on a rug while the cat sat on the mat",
    "paris is the capital of france and berlin is in germany",
    "sparse retrieval weighs every vocabulary term of a document",
] * 4

TEXTS = [
    "the cat",
    "the quick brown fox jumps over the lazy dog and the cat sat on the mat",
    "pooler serves embedding models",
    "disentangled attention scores content and relative position separately, while a feline "
    "rested on a rug and sparse retrieval weighs every vocabulary term of a document in paris",
    "fox",
    "paris is the capital of france",
]

# DeBERTa-v3 base, scaled down.
V3 = dict(relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8,
          max_relative_positions=24, share_att_key=True, norm_rel_ebd="layer_norm",
          position_biased_input=False, type_vocab_size=0, hidden_act="gelu")
# DeBERTa-v2 (xlarge-style): no buckets, separate position projections, the layer-0
# convolution, absolute positions added to the input, a smaller embedding size, token types.
V2 = dict(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=-1,
          max_relative_positions=12, share_att_key=False, norm_rel_ebd="none",
          position_biased_input=True, type_vocab_size=2, conv_kernel_size=3, conv_act="gelu",
          embedding_size=24)
# DeBERTa (v1) base, scaled down.
V1 = dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=12,
          position_biased_input=False, type_vocab_size=0)


def save_tokenizer(folder: Path, model_max_length: int = 128) -> int:
    """A DebertaV2Tokenizer over a Unigram vocabulary trained on CORPUS; returns its size."""
    tokenizer = unigram_deberta_tokenizer(CORPUS, 200, model_max_length=model_max_length)
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def build_deberta(folder: Path, model_cls_name: str = "DebertaV2Model", seed: int = 0,
                  style: dict = V3, **overrides):
    """Save a seeded random Deberta*/DebertaV2* model and its tokenizer; return the model."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = save_tokenizer(folder)
    torch.manual_seed(seed)
    v1 = not model_cls_name.startswith("DebertaV2")
    config_cls = transformers.DebertaConfig if v1 else transformers.DebertaV2Config
    kwargs = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=3,
                  num_attention_heads=4, intermediate_size=48, max_position_embeddings=128,
                  pad_token_id=0, id2label={0: "A", 1: "B", 2: "C"},
                  label2id={"A": 0, "B": 1, "C": 2}, **style)
    kwargs.update(overrides)
    model = getattr(transformers, model_cls_name)(config_cls(**kwargs))
    with torch.no_grad():  # perturb every tensor (norms and biases too) so a misplaced one shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model.eval()
