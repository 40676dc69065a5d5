"""A random-weight ColModernVBert folder at the real shape, for the `visual_retrieval` workload.

Built once (seeded) under the bench cache by transformers itself (ColModernVBertForRetrieval
+ ColModernVBertProcessor.save_pretrained), in the layout users download. The shape is
transformers 5.24's ColModernVBertConfig defaults (ModernVBERT/colmodernvbert's):
- vision: SigLIP-B/16 (12 x 768, MLP 3072) at 512 px tiles -> 32 x 32 = 1,024 patches per tile,
  pixel shuffle 4 -> 64 image vectors per tile;
- text: ModernBERT-base (22 x 768, MLP 1152, local attention 128, global every 3rd layer,
  vocabulary 50,368);
- head: 128-d per token.
Processor: Idefics3 splitting with 512 px tiles, pages resized to a longest edge of 2,048 px
(SmolVLM's setting, which ModernVBERT's processor keeps): a letter page becomes 4 x 4 tiles + the
global image = 17 tiles, 1,088 image vectors.

The real tokenizer (ModernBERT's BPE) is not available offline: a byte-level BPE trained on a
small corpus stands in (vocabulary ~1,000, so queries run somewhat more tokens than with the
real one) with the image and special tokens the processor needs (pooler/bench/
modernbert_tokenizer.py, shared with the tests' tiny folders); the token table keeps the real
50,368 rows. Speed does not depend on the weights. `tiny=True` keeps the structure at 32 px
tiles of 4 px patches, 2 layers of width 24-32 and pages of at most 3 x 3 tiles (--quick).
"""
from __future__ import annotations

from pathlib import Path

from pooler.bench.common import cached_folder
from pooler.bench.modernbert_tokenizer import SPECIALS, save_colmodernvbert_processor

REAL_VOCAB = 50368
_CORPUS = ("which page shows the quarterly revenue chart and the table of operating costs "
           "User: Describe the image.\nAssistant: a page of an annual report with figures, "
           "invoices, totals by region, the board members, risk factors and a summary of "
           "cash flow for the fiscal year 2024 compared with 2023").split(". ")


def _shape(tiny: bool) -> dict:
    if tiny:
        return dict(tile=32, patch=4, shuffle=2, longest_edge=96,
                    vision=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                num_attention_heads=2),
                    text=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=2, local_attention=8),
                    embedding_dim=16)
    return dict(tile=512, patch=16, shuffle=4, longest_edge=2048,
                vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                            num_attention_heads=12),
                text=dict(hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                          num_attention_heads=12, local_attention=128),
                embedding_dim=128)


def _build(dest: Path, tiny: bool) -> None:
    import torch
    import transformers

    shape = _shape(tiny)
    image_seq_len = (shape["tile"] // shape["patch"]) ** 2 // shape["shuffle"] ** 2
    tokenizer = save_colmodernvbert_processor(
        dest, _CORPUS * 4, vocab_size=1000, model_max_length=8192,
        longest_edge=shape["longest_edge"], tile=shape["tile"], image_seq_len=image_seq_len)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    text = dict(vocab_size=len(tokenizer) if tiny else max(REAL_VOCAB, len(tokenizer)),
                global_attn_every_n_layers=3, max_position_embeddings=8192,
                pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
                sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"],
                eos_token_id=ids["[SEP]"], **shape["text"])
    vision = dict(image_size=shape["tile"], patch_size=shape["patch"], **shape["vision"])
    config = transformers.ColModernVBertConfig(
        vlm_config=dict(text_config=text, vision_config=vision,
                        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                        pixel_shuffle_factor=shape["shuffle"]),
        embedding_dim=shape["embedding_dim"])
    torch.manual_seed(0)
    transformers.ColModernVBertForRetrieval(config).eval().save_pretrained(dest)


def page_folder(tiny: bool = False) -> Path:
    """The cached ColModernVBert folder (real shape, or the --quick tiny one)."""
    return cached_folder(f"colmodernvbert{'-tiny' if tiny else ''}-v1",
                         lambda dest: _build(dest, tiny))


def vision_flops_per_tile(hf_config: dict) -> float:
    """Forward FLOPs (2 per multiply-add) of the SigLIP tower on one tile, GEMM-shaped work
    only: the patch embedding, per layer Q/K/V/output and MLP projections plus attention's
    scores and weighted sum. ColModernVBert drops SigLIP's pooling head."""
    v = hf_config["vlm_config"]["vision_config"]
    h, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), \
        int(v["num_hidden_layers"])
    patch, size = int(v["patch_size"]), int(v["image_size"])
    tokens = (size // patch) ** 2
    flops = 2 * tokens * 3 * patch * patch * h
    flops += layers * (2 * tokens * (4 * h * h + 2 * h * inter) + 4 * tokens * tokens * h)
    return float(flops)
