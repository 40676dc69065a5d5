"""Random-weight long-context encoders at real sizes, for the `long_context` workload.

Each is a sentence-transformers folder (seeded weights saved by transformers in the real on-disk
format, max_seq_length 8,192) built once under the bench cache, like pooler/bench/arch_folders.py:
- modernbert-base: ModernBERT-base's shape (22 x 768, GeGLU 1,152, 12 heads, a global layer every
  3rd, local window 128, max_position_embeddings 8,192), mean pooling;
- nomic: nomic-embed-text-v1.5 (NomicBert 12 x 768, SwiGLU 3,072), mean pooling;
- gte: gte-base-en-v1.5 (GTE 12 x 768, GeGLU 3,072), CLS pooling;
- bge-m3: BGE-M3's dense encoder (XLMRobertaModel 24 x 1024, 16 heads, 4,096, max positions
  8,194), CLS pooling;
- jina-v3: jina-embeddings-v3 (24 x 1024, rotary XLM-R), mean pooling (on request).
All use all-MiniLM-L6-v2's WordPiece tokenizer (30,522 tokens), so every side tokenizes the same
way and the embedding tables stay small; the per-token compute of the stacks is the real models'.
`tiny=True` keeps each structure (ModernBERT: 3 layers, one global, local window 16) at widths
of 32 (the --quick smoke run).
"""
from __future__ import annotations

from pathlib import Path

from pooler.bench.arch_folders import ArchModel, st_builder
from pooler.bench.common import cached_folder

MAX_LEN = 8192
_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072)
_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
              intermediate_size=4096)
# all-MiniLM-L6-v2's special tokens: [PAD] 0, [CLS] 101, [SEP] 102
_SPECIALS = dict(pad_token_id=0)

LONG_MODELS: dict[str, ArchModel] = {m.name: m for m in (
    ArchModel("modernbert-base", "ModernBertModel", "embed", st_builder(
        "ModernBertConfig", "ModernBertModel", "mean", MAX_LEN,
        tiny_overrides={"num_hidden_layers": 3, "local_attention": 16},
        hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
        local_attention=128, global_attn_every_n_layers=3, max_position_embeddings=MAX_LEN,
        cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
        **_SPECIALS)),
    ArchModel("nomic", "NomicBertModel", "embed", st_builder(
        "NomicBertConfig", "NomicBertModel", "mean", MAX_LEN, **_BASE,
        max_position_embeddings=MAX_LEN, **_SPECIALS)),
    ArchModel("gte", "GteModel", "embed", st_builder(
        "GteConfig", "GteModel", "cls", MAX_LEN, **_BASE, max_position_embeddings=MAX_LEN,
        **_SPECIALS)),
    # Positions start after the padding index (XLM-R): 8,192 tokens need 8,193 positions.
    ArchModel("bge-m3", "XLMRobertaModel", "embed", st_builder(
        "XLMRobertaConfig", "XLMRobertaModel", "cls", MAX_LEN, **_LARGE,
        max_position_embeddings=MAX_LEN + 2, type_vocab_size=1, **_SPECIALS)),
    ArchModel("jina-v3", "JinaEmbeddingsV3Model", "embed", st_builder(
        "JinaEmbeddingsV3Config", "JinaEmbeddingsV3Model", "mean", MAX_LEN, **_LARGE,
        max_position_embeddings=MAX_LEN + 2, **_SPECIALS)),
)}
DEFAULT_LONG_ARCHS = ("modernbert-base", "nomic", "gte", "bge-m3")


def long_folder(name: str, tiny: bool) -> Path:
    """The model folder of `name`, built once per size under the bench cache."""
    model = LONG_MODELS[name]
    return cached_folder(f"long-{name}-{'tiny' if tiny else 'base'}-seed0",
                         lambda dest: model.build(dest, tiny))
