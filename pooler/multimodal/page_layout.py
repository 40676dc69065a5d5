"""Facts of a page-retrieval folder (ColModernVBert: images in one sequence with the text, scored
by late interaction) that the engine's configuration needs before any model is built: widths,
the text length limit, and what the largest page costs a step. Read from config.json and the
processor's settings without decoding anything.

A page costs a step `len(input_ids)` text tokens plus `num_tiles * vision_tokens_per_tile`
vision-tower tokens; the largest page has `max_tiles` tiles (the resized page's grid plus the
global image), so `max_page_tokens` bounds what one page charges the scheduler.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# architecture -> what pooler calls its page inputs
PAGE_ARCHITECTURES = {"ColModernVBertForRetrieval": "colmodernvbert"}


@dataclass(frozen=True)
class PageLayout:
    kind: str                   # "colmodernvbert"
    text_hidden_size: int       # the text model's width (what the head projects)
    embedding_dim: int          # length of one multi-vector row
    text_max_positions: int     # the text model's position limit
    vision_tokens_per_tile: int
    max_tiles: int              # tiles of the largest page (grid + global image)

    @property
    def max_page_tokens(self) -> int:
        """What the longest page may charge a step: its prompt plus its tiles' vision tokens."""
        return self.text_max_positions + self.max_tiles * self.vision_tokens_per_tile

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
        tile = int(vision.get("image_size", 224))
        patch = int(vision.get("patch_size", 16))
        image = _processor_image_settings(path)
        tile_side = int((image.get("max_image_size") or {}).get("longest_edge", tile))
        size = image.get("size") or {}
        longest = size.get("longest_edge") or max(size.get("height", 0), size.get("width", 0)) \
            or tile_side
        grid = math.ceil(int(longest) / tile_side) if image.get("do_image_splitting", True) else 0
        max_tiles = grid * grid + 1 if grid > 1 else 1
        return cls(kind, int(text.get("hidden_size", 768)),
                   int(hf_config.get("embedding_dim", 128)),
                   int(text.get("max_position_embeddings", 8192)),
                   (tile // patch) ** 2, max_tiles)


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
