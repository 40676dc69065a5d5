"""What ColModernVBert's queries and page images become before the model: token ids (the
document prompt with its `<image>` expanded to one placeholder per image vector) and pixel tiles.
Mirrors transformers' ColModernVBertProcessor.process_queries / process_images.

The engine, per model (once): `prompts = ColModernVBertPrompts.from_folder(path)` and the
folder's TextTokenizer; `prompts.check_tokenizer(tokenizer, backbone.image_token_id)` and
`prompts.check_model(backbone.tile_side, backbone.image_seq_len)` refuse a folder whose processor
does not fit its model.

Per query: `prompts.query_text(query)` (query_prefix + query + ten `<end_of_utterance>`
augmentation tokens), tokenized with special tokens like any text; it runs text-only and every
token's vector is kept (the augmentation tokens are attended to, unlike ColBERT's [MASK]s).

Per page image (an RGB PIL image, pooler/multimodal/media.py): `build_document_inputs(image,
prompts, tokenizer)` -> ColModernVBertDocument. The engine sends `input_ids` as the request's
tokens (never truncated: a cut placeholder block cannot be scored; refuse a page longer than the
model's limit) and charges the scheduler `len(input_ids)` text tokens plus `num_tiles *
backbone.vision_tokens_per_tile` vision-tower tokens (1,024 per 512px tile of 16px patches; a
page has up to rows * cols + 1 tiles). `pixel_values` go to the mm cache under the image's
content hash; the runner calls `backbone.image_features(pixel_values)` (or takes the result
from the encoder cache), then `backbone(inputs, image_embeds=...)` with every document's
features concatenated in batch order (pooler/models/colmodernvbert.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from pooler.multimodal.idefics3_processing import (
    COLMODERNVBERT_VISUAL_PROMPT, IMAGE_TOKEN, Idefics3ImageConfig, expand_image_prompt,
    process_image)
from pooler.tokenizer import TextTokenizer

QUERY_AUGMENTATION_TOKEN = "<end_of_utterance>"
NUM_QUERY_AUGMENTATION_TOKENS = 10  # ColModernVBertProcessor.process_queries' default suffix


@dataclass(frozen=True)
class ColModernVBertPrompts:
    """The processor settings of a ColModernVBert folder."""

    image_config: Idefics3ImageConfig
    image_seq_len: int                # <image> tokens per tile
    visual_prompt_prefix: str         # the document prompt, holding one <image>
    query_prefix: str = ""

    @classmethod
    def from_folder(cls, path: Path) -> "ColModernVBertPrompts":
        """processor_config.json (transformers 5 nests the image processor's settings in it;
        older folders keep them in preprocessor_config.json)."""
        processor = _read(path / "processor_config.json")
        image = processor.get("image_processor") or _read(path / "preprocessor_config.json")
        if not image:
            raise ValueError(f"{path} has no image processor settings (processor_config.json's "
                             "image_processor or preprocessor_config.json): save the folder "
                             "with ColModernVBertProcessor.save_pretrained.")
        seq_len = int(processor.get("image_seq_len", 64))
        prompt = processor.get("visual_prompt_prefix") or COLMODERNVBERT_VISUAL_PROMPT
        if prompt.count(IMAGE_TOKEN) != 1:
            raise ValueError(f"{path}/processor_config.json: visual_prompt_prefix must hold "
                             f"exactly one {IMAGE_TOKEN}, got {prompt!r}.")
        return cls(image_config=Idefics3ImageConfig.from_preprocessor_config(image),
                   image_seq_len=seq_len, visual_prompt_prefix=prompt,
                   query_prefix=processor.get("query_prefix") or "")

    def query_text(self, query: str) -> str:
        return self.query_prefix + query + QUERY_AUGMENTATION_TOKEN * NUM_QUERY_AUGMENTATION_TOKENS

    def check_tokenizer(self, tokenizer: TextTokenizer, image_token_id: int) -> None:
        """The tokenizer must spell <image> as the model's image_token_id, and know the
        augmentation token as one token."""
        found = tokenizer.token_to_id(IMAGE_TOKEN)
        if found != image_token_id:
            raise ValueError(f"the tokenizer's {IMAGE_TOKEN} id is {found}, config.json's "
                             f"vlm_config.image_token_id {image_token_id}: the folder's tokenizer "
                             "is not the model's.")
        if tokenizer.token_to_id(QUERY_AUGMENTATION_TOKEN) is None:
            raise ValueError(f"the tokenizer has no {QUERY_AUGMENTATION_TOKEN} token: the "
                             "folder's tokenizer is not ColModernVBert's.")

    def check_model(self, tile_side: int, image_seq_len: int) -> None:
        """The preprocessor's tiles and placeholders must be what the model computes."""
        if self.image_config.tile_side != tile_side or self.image_seq_len != image_seq_len:
            raise ValueError(f"the processor makes {self.image_config.tile_side}px tiles with "
                             f"{self.image_seq_len} <image> tokens each, the model takes "
                             f"{tile_side}px tiles making {image_seq_len} vectors each: "
                             "processor_config.json (max_image_size, image_seq_len) does not "
                             "match config.json (vision_config image_size / patch_size, "
                             "pixel_shuffle_factor).")


@dataclass(frozen=True)
class ColModernVBertDocument:
    input_ids: list[int]        # [seq_len] the document prompt, placeholders expanded
    pixel_values: np.ndarray    # [num_tiles, 3, tile_side, tile_side] float32: rows x cols
    #                             tiles row-major, then the global image (one tile if unsplit)
    rows: int                   # tile grid (0, 0 when the image was not split)
    cols: int
    num_image_tokens: int       # <image> placeholders in input_ids = num_tiles * image_seq_len

    @property
    def num_tiles(self) -> int:
        return int(self.pixel_values.shape[0])


def build_document_inputs(image: Image.Image, prompts: ColModernVBertPrompts,
                          tokenizer: TextTokenizer) -> ColModernVBertDocument:
    """One RGB page image -> its prompt's token ids and its tiles."""
    processed = process_image(image, prompts.image_config)
    text = expand_image_prompt(processed.rows, processed.cols, prompts.image_seq_len,
                               prompts.visual_prompt_prefix)
    ids = tokenizer.encode_batch([text])[0].input_ids
    image_token_id = tokenizer.token_to_id(IMAGE_TOKEN)
    count = sum(1 for i in ids if i == image_token_id)
    expected = processed.pixel_values.shape[0] * prompts.image_seq_len
    if count != expected:
        raise ValueError(f"the document prompt tokenized to {count} {IMAGE_TOKEN} tokens, its "
                         f"{processed.pixel_values.shape[0]} tiles need {expected}: the "
                         f"tokenizer must hold {IMAGE_TOKEN} as one special token.")
    return ColModernVBertDocument(input_ids=ids, pixel_values=processed.pixel_values,
                                  rows=processed.rows, cols=processed.cols,
                                  num_image_tokens=count)


def _read(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)
