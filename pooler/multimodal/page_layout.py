"""Facts of a page-retrieval folder (ColModernVBert: images in one sequence with the text, scored
by late interaction) that the engine's configuration needs before any model is built: widths,
the text length limit, and what the largest page costs a step. Read from config.json and the
processor's settings without decoding anything.

A page costs a step `len(input_ids)` text tokens plus `num_tiles * vision_tokens_per_tile`
vision-tower tokens; the largest page has `max_tiles` tiles (the resized page's grid plus the
global image), so `max_page_tokens` bounds what one page charges the scheduler (the default
step budget is raised to fit it).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# architecture -> what pooler calls its page inputs
PAGE_ARCHITECTURES = {"ColModernVBertForRetrieval": "colmodernvbert",
                      "ColPaliForRetrieval": "colpali", "ColQwen2ForRetrieval": "colqwen2"}
# Room for a page prompt's text around its image placeholders (ColModernVBert's is ~20 tokens).
PROMPT_TOKENS = 128
# kinds run by transformers' own retrieval class and processor (pooler/worker/colvision_runner.py)
TRANSFORMERS_PAGE_KINDS = {"colpali": "ColPaliProcessor", "colqwen2": "ColQwen2Processor"}


@dataclass(frozen=True)
class PageLayout:
    kind: str                   # "colmodernvbert" | "colpali" | "colqwen2"
    text_hidden_size: int       # the text model's width (what the head projects)
    embedding_dim: int          # length of one multi-vector row
    text_max_positions: int     # the text model's position limit
    vision_tokens_per_tile: int
    max_tiles: int              # tiles of the largest page (grid + global image)
    image_tokens_per_tile: int  # placeholders a tile puts in the prompt

    @property
    def runner(self) -> str:
        """"native", or "transformers" for ColPali / ColQwen2 (their classes, on padded
        batches)."""
        return "transformers" if self.kind in TRANSFORMERS_PAGE_KINDS else "native"

    @property
    def max_page_tokens(self) -> int:
        """What the largest page may charge a step: its tiles' placeholders and vision tokens,
        and room for the rest of its prompt."""
        return self.max_tiles * (self.image_tokens_per_tile + self.vision_tokens_per_tile) + \
            PROMPT_TOKENS

    @classmethod
    def of(cls, architecture: str, hf_config: dict, path: Path) -> "PageLayout | None":
        kind = PAGE_ARCHITECTURES.get(architecture)
        if kind is None:
            return None
        vlm = hf_config.get("vlm_config")
        if not isinstance(vlm, dict):
            raise ValueError(f"{path}/config.json has no vlm_config: {architecture} folders are "
                             "saved by transformers >= 5 (ColModernVBertConfig).")
        text = vlm.get("text_config") or {}
        vision = vlm.get("vision_config") or {}
        image = _processor_image_settings(path)
        embedding_dim = int(hf_config.get("embedding_dim", 128))
        if kind == "colpali":  # one fixed-size image: (image_size / patch)**2 vision tokens
            side, patch = int(vision.get("image_size", 448)), int(vision.get("patch_size", 14))
            return cls(kind, int(text.get("hidden_size", 2048)), embedding_dim,
                       int(text.get("max_position_embeddings", 8192)), (side // patch) ** 2, 1,
                       (side // patch) ** 2)
        if kind == "colqwen2":  # dynamic resolution: at most max_pixels / patch**2 patches
            patch = int(image.get("patch_size") or vision.get("patch_size", 14))
            size = image.get("size") or {}
            max_pixels = int(image.get("max_pixels") or size.get("longest_edge") or 12845056)
            merge = int(image.get("merge_size") or vision.get("spatial_merge_size", 2))
            patches = max_pixels // (patch * patch)
            return cls(kind, int(text.get("hidden_size", 1536)), embedding_dim,
                       int(text.get("max_position_embeddings", 32768)), patches, 1,
                       patches // (merge * merge))
        tile = int(vision.get("image_size", 224))
        patch = int(vision.get("patch_size", 16))
        tile_side = int((image.get("max_image_size") or {}).get("longest_edge", tile))
        size = image.get("size") or {}
        longest = size.get("longest_edge") or max(size.get("height", 0), size.get("width", 0)) \
            or tile_side
        grid = math.ceil(int(longest) / tile_side) if image.get("do_image_splitting", True) else 0
        max_tiles = grid * grid + 1 if grid > 1 else 1
        factor = int(vlm.get("pixel_shuffle_factor", 4))
        return cls(kind, int(text.get("hidden_size", 768)), embedding_dim,
                   int(text.get("max_position_embeddings", 8192)),
                   (tile // patch) ** 2, max_tiles, (tile // patch) ** 2 // factor ** 2)


def _processor_image_settings(path: Path) -> dict:
    """processor_config.json's image_processor (transformers 5), else preprocessor_config.json."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = Path(path) / name
        if file.is_file():
            data = json.loads(file.read_text(encoding="utf-8"))
            image = data.get("image_processor") if name == "processor_config.json" else data
            if image:
                return image
    return {}
