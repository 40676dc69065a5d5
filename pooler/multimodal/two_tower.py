"""Facts of a two-tower image-text folder (CLIP, SigLIP, SigLIP2) read from its config, and
the image architectures pooler recognises but does not run (page retrieval models:
pooler/multimodal/page_layout.py).

Text rules follow the reference processors in transformers 5.24:
- CLIP: the tokenizer's own framing (BOS text EOS), no padding; the model pools at the EOS.
- SigLIP / SigLIP2: every text is padded to the text tower's length (64 in the released
  models) with an attention mask, and the model pools the last position. Right padding keeps
  the pads as keys nobody attends to (their last one is the pooled query); left padding (the
  default of transformers' Siglip2Tokenizer) drops them and starts positions after them, which
  computes the same states. SigLIP2's tokenizer lowercases its input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pooler.multimodal.page_layout import PAGE_ARCHITECTURES

# architecture -> model kind
TWO_TOWER_ARCHITECTURES = {"CLIPModel": "clip", "SiglipModel": "siglip",
                           "Siglip2Model": "siglip2"}

_RUNS_INSTEAD = ("pooler runs image-text embedding models CLIPModel, SiglipModel and "
                 "Siglip2Model (images and texts in one space), page retrieval with "
                 "ColModernVBertForRetrieval, ColPaliForRetrieval and ColQwen2ForRetrieval "
                 "(late interaction over page images) and text-only ColBERT models")

# Image architectures pooler does not run (yet): architecture -> what it is.
UNSUPPORTED_IMAGE_ARCHITECTURES = {
    "ModernVBertForRetrieval": "ColModernVBert in its original layout (re-save it with "
                               "transformers' ColModernVBertForRetrieval.save_pretrained)",
    "ColIdefics3ForRetrieval": "ColSmol / ColIdefics3 (multi-vector page retrieval)",
    "Idefics3ForConditionalGeneration": "Idefics3 (vision-language model)",
    "Idefics3Model": "Idefics3 (vision-language model)",
    "Qwen2VLForConditionalGeneration": "Qwen2-VL (vision-language model)",
    "Qwen2VLModel": "Qwen2-VL (vision-language model)",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2.5-VL (vision-language model)",
    "Qwen2_5_VLModel": "Qwen2.5-VL (vision-language model)",
    "PaliGemmaForConditionalGeneration": "PaliGemma (vision-language model)",
    "LlavaForConditionalGeneration": "LLaVA (vision-language model)",
    "CLIPVisionModel": "CLIP's vision tower alone",
    "CLIPVisionModelWithProjection": "CLIP's vision tower alone",
    "CLIPTextModel": "CLIP's text tower alone",
    "CLIPTextModelWithProjection": "CLIP's text tower alone",
    "SiglipVisionModel": "SigLIP's vision tower alone",
    "SiglipTextModel": "SigLIP's text tower alone",
    "Siglip2VisionModel": "SigLIP2's vision tower alone",
    "BlipModel": "BLIP", "AlignModel": "ALIGN", "ChineseCLIPModel": "Chinese-CLIP",
}


def sentence_transformers_clip_path(root: Path) -> Path | None:
    """A sentence-transformers CLIP folder (clip-ViT-B-32) keeps the transformers model, its
    processor and tokenizer in the CLIPModel module's subfolder: that folder, else None."""
    modules_file = Path(root) / "modules.json"
    if (Path(root) / "config.json").is_file() or not modules_file.is_file():
        return None
    for module in json.loads(modules_file.read_text()):
        if str(module.get("type", "")).rsplit(".", 1)[-1] == "CLIPModel":
            return Path(root) / module.get("path", "")
    return None


def unsupported_image_model_message(architecture: str, hf_config: dict) -> str | None:
    """One line naming an image architecture pooler cannot run and what it runs instead;
    None for anything else (text models go their usual way)."""
    what = UNSUPPORTED_IMAGE_ARCHITECTURES.get(architecture)
    if what is None and architecture not in TWO_TOWER_ARCHITECTURES and \
            architecture not in PAGE_ARCHITECTURES and (
            "vision_config" in hf_config or "vlm_config" in hf_config):
        what = "a model with a vision tower"
    if what is None:
        return None
    return (f"{architecture} is {what}, which pooler does not run yet; {_RUNS_INSTEAD}.")


@dataclass(frozen=True)
class TwoTowerLayout:
    kind: str                 # "clip" | "siglip" | "siglip2"
    embed_dim: int            # length of an image or text embedding
    text_max_positions: int   # the text tower's position table
    vision_patch_size: int
    class_token: bool         # CLIP's vision tower adds one token to the patches
    pad_text_to: int | None   # SigLIP: every text padded to this many tokens
    padding_side: str         # where the pads go when pad_text_to is set
    lowercase: bool           # the reference tokenizer lowercases text first

    @classmethod
    def of(cls, architecture: str, hf_config: dict, tokenizer_config: dict
           ) -> "TwoTowerLayout | None":
        kind = TWO_TOWER_ARCHITECTURES.get(architecture)
        if kind is None:
            return None
        text = hf_config.get("text_config") or {}
        vision = hf_config.get("vision_config") or {}
        if kind == "clip":
            return cls(kind, int(hf_config.get("projection_dim", 512)),
                       int(text.get("max_position_embeddings", 77)),
                       int(vision.get("patch_size", 32)), True, None, "right", False)
        positions = int(text.get("max_position_embeddings", 64))
        side = tokenizer_config.get("padding_side") or ("left" if kind == "siglip2" else "right")
        return cls(kind, int(text.get("projection_size") or text.get("hidden_size", 768)),
                   positions, int(vision.get("patch_size", 16)), False, positions, side,
                   kind == "siglip2")

    @property
    def model_tasks(self) -> frozenset[str]:
        return frozenset({"embed"})
