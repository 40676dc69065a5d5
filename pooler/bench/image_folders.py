"""Random-weight image-text model folders at real shapes, for the `image_embed` workload.

Built once (seeded) under the bench cache by transformers itself, in the layout users download
(config.json, model.safetensors, preprocessor_config.json, tokenizer files):
- clip: openai/clip-vit-base-patch32's shape (CLIPModel: vision ViT-B/32 at 224 x 224,
  12 x 768, 49 patches + a class token; text 12 x 512; projection 512), its
  CLIPImageProcessor settings (shortest edge 224 bicubic, center crop 224, OpenAI mean/std);
- siglip: google/siglip-base-patch16-224's shape (SiglipModel: vision ViT-B/16 at 224 x 224,
  12 x 768, 196 patches, attention-pooling head; text 12 x 768 on 64 padded tokens), its
  SiglipImageProcessor settings (224 x 224 bicubic, mean/std 0.5).
Speed does not depend on the weights. Both use all-MiniLM-L6-v2's WordPiece tokenizer (the
real BPE / SentencePiece vocabularies are not available offline) with the vocabulary cut to its
30,522 tokens: text towers keep their real per-token compute. `tiny=True` keeps the structure
at 2 layers of width 32 and 32 x 32 images (the --quick smoke run).
"""
from __future__ import annotations

from pathlib import Path

from pooler.bench.common import cached_folder, copy_minilm_tokenizer

IMAGE_MODELS = ("clip", "siglip")
VOCAB = 30522
CLS_ID, SEP_ID, PAD_ID = 101, 102, 0  # MiniLM's [CLS], [SEP], [PAD]


def _tower(tiny: bool, hidden: int, inter: int, heads: int) -> dict:
    if tiny:
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2)
    return dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=12,
                num_attention_heads=heads)


def _build_clip(dest: Path, tiny: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    image = 32 if tiny else 224
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=77, bos_token_id=CLS_ID,
                         eos_token_id=SEP_ID, pad_token_id=PAD_ID,
                         **_tower(tiny, 512, 2048, 8)),
        vision_config=dict(image_size=image, patch_size=8 if tiny else 32,
                           **_tower(tiny, 768, 3072, 12)),
        projection_dim=24 if tiny else 512)
    config.architectures = ["CLIPModel"]
    transformers.CLIPModel(config).eval().save_pretrained(dest)
    transformers.CLIPImageProcessorPil(
        size={"shortest_edge": image},
        crop_size={"height": image, "width": image}).save_pretrained(dest)
    copy_minilm_tokenizer(dest)


def _build_siglip(dest: Path, tiny: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    image = 32 if tiny else 224
    config = transformers.SiglipConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=64,
                         pad_token_id=PAD_ID, eos_token_id=SEP_ID,
                         **_tower(tiny, 768, 3072, 12)),
        vision_config=dict(image_size=image, patch_size=8 if tiny else 16,
                           **_tower(tiny, 768, 3072, 12)))
    config.architectures = ["SiglipModel"]
    transformers.SiglipModel(config).eval().save_pretrained(dest)
    transformers.SiglipImageProcessorPil(size={"height": image, "width": image}
                                         ).save_pretrained(dest)
    copy_minilm_tokenizer(dest)


_BUILDERS = {"clip": _build_clip, "siglip": _build_siglip}


def image_folder(name: str, tiny: bool = False) -> Path:
    """The cached folder of `name` (one of IMAGE_MODELS), built on first use."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown image model {name!r}; choose from {list(IMAGE_MODELS)}.")
    build = _BUILDERS[name]
    return cached_folder(f"image-{name}{'-tiny' if tiny else ''}-v2",
                         lambda dest: build(dest, tiny))


def text_length(name: str, tiny: bool = False) -> int | None:
    """SigLIP's reference processor pads every text to the text tower's length (64, tiny
    folders too: captions fit); CLIP's does not pad (None)."""
    return None if name == "clip" else 64


def vision_flops_per_image(hf_config: dict) -> float:
    """Forward FLOPs (2 per multiply-add) of the vision tower on one image, GEMM-shaped work
    only: the patch embedding, per layer the Q/K/V/output and MLP projections over every
    token plus attention's scores and weighted sum (2 x 2 x L^2 x hidden), then SigLIP's
    attention-pooling head (one probe query over L keys and values, its MLP on one token) or
    CLIP's visual projection of the class token. Layer norms, softmax and activations are
    left out (a few per cent, none of them GEMMs)."""
    v = hf_config["vision_config"]
    h, inter, layers = int(v["hidden_size"]), int(v["intermediate_size"]), \
        int(v["num_hidden_layers"])
    patch, size = int(v["patch_size"]), int(v["image_size"])
    channels = int(v.get("num_channels", 3))
    patches = (size // patch) ** 2
    clip = "CLIP" in hf_config.get("architectures", ["CLIPModel"])[0]
    tokens = patches + (1 if clip else 0)
    flops = 2 * patches * channels * patch * patch * h                      # patch embedding
    flops += layers * (2 * tokens * (4 * h * h + 2 * h * inter) + 4 * tokens * tokens * h)
    if clip:
        flops += 2 * h * int(hf_config.get("projection_dim", 512))          # visual projection
    else:  # probe q + k/v over L tokens + out proj + scores/sum + MLP on the pooled token
        flops += 2 * h * h + 2 * tokens * 2 * h * h + 2 * h * h + 4 * tokens * h \
            + 2 * 2 * h * inter
    return float(flops)


def vision_tokens_per_image(hf_config: dict) -> int:
    v = hf_config["vision_config"]
    patches = (int(v["image_size"]) // int(v["patch_size"])) ** 2
    return patches + (1 if "CLIP" in hf_config.get("architectures", ["CLIPModel"])[0] else 0)
