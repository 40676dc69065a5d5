"""Idefics3-style image preprocessing (ColModernVBert's page images), in numpy + Pillow.

The image is resized so its longest edge is ``size["longest_edge"]``, then grown to whole
multiples of the vision encoder's input side ``max_image_size["longest_edge"]`` (M) and cut into
a grid of M x M tiles, row by row, followed by the whole image squeezed to M x M (the "global"
image). An image that fits in one tile is not split. Each tile is rescaled and normalized; a batch
is zero-padded to the largest tile count with a pixel mask. The prompt gets, per image, one
block of ``image_seq_len`` ``<image>`` tokens per tile, each tile introduced by its
``<row_r_col_c>`` tag, and a ``<global-img>`` block. Mirrors transformers'
``Idefics3ImageProcessorPil`` and ``ColModernVBertProcessor``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from pooler.multimodal.media import require_rgb

IMAGENET_STANDARD_MEAN = (0.5, 0.5, 0.5)
IMAGENET_STANDARD_STD = (0.5, 0.5, 0.5)
DEFAULT_TILE_SIDE = 364
DEFAULT_LONGEST_EDGE = 4 * DEFAULT_TILE_SIDE
MAX_IMAGE_SIDE = 4096  # transformers' absolute cap on either side after the first resize

FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"
COLMODERNVBERT_VISUAL_PROMPT = "<|begin_of_text|>User:<image>Describe the image.<end_of_utterance>\nAssistant:"


@dataclass(frozen=True)
class Idefics3ImageConfig:
    """The preprocessor_config.json keys that shape an Idefics3-style image."""

    longest_edge: int | None = DEFAULT_LONGEST_EDGE  # first resize; None with size height/width
    resize_height: int | None = None
    resize_width: int | None = None
    tile_side: int = DEFAULT_TILE_SIDE  # max_image_size["longest_edge"]
    resample: int = int(Image.Resampling.LANCZOS)
    do_resize: bool = True
    do_image_splitting: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = IMAGENET_STANDARD_MEAN
    image_std: tuple[float, ...] = IMAGENET_STANDARD_STD

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> "Idefics3ImageConfig":
        size = config.get("size") or {"longest_edge": DEFAULT_LONGEST_EDGE}
        tile = (config.get("max_image_size") or {"longest_edge": DEFAULT_TILE_SIDE}).get("longest_edge")
        if not isinstance(tile, int) or tile <= 0:
            raise ValueError(f"preprocessor config max_image_size must be {{'longest_edge': <positive int>}}, "
                             f"got {config.get('max_image_size')!r}")
        longest = size.get("longest_edge")
        height, width = size.get("height"), size.get("width")
        if longest is None and not (height and width):
            raise ValueError(f"preprocessor config size must have 'longest_edge' or 'height' and 'width', got {size!r}")
        return cls(
            longest_edge=int(longest) if longest else None,
            resize_height=int(height) if height else None,
            resize_width=int(width) if width else None,
            tile_side=tile,
            resample=int(config.get("resample", Image.Resampling.LANCZOS)),
            do_resize=bool(config.get("do_resize", True)),
            do_image_splitting=bool(config.get("do_image_splitting", True)),
            do_rescale=bool(config.get("do_rescale", True)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
            do_normalize=bool(config.get("do_normalize", True)),
            image_mean=_per_channel(config.get("image_mean", IMAGENET_STANDARD_MEAN), "image_mean"),
            image_std=_per_channel(config.get("image_std", IMAGENET_STANDARD_STD), "image_std"),
        )


@dataclass(frozen=True)
class Idefics3Image:
    pixel_values: np.ndarray  # [num_tiles, 3, H, W] float32: rows*cols tiles row-major, then the global image
    pixel_attention_mask: np.ndarray  # [num_tiles, H, W] int64: 1 on real pixels, 0 on padding
    rows: int  # tile grid; 0 and 0 when the image was not split (one tile)
    cols: int


def _per_channel(value: float | list[float], name: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * 3
    if len(values) != 3:
        raise ValueError(f"preprocessor config {name} must have 3 values (R, G, B), got {list(values)}")
    return values


def _longest_edge_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """(height, width) with the longest side at ``longest_edge`` (up or down), the other side even."""
    aspect = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    # then shrink below the absolute cap (only ever hit with longest_edge > 4096)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """Grow to whole tiles; the short side follows the long side's new length, as transformers does."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _resize(image: Image.Image, height: int, width: int, resample: int) -> Image.Image:
    return image.resize((width, height), resample=resample)


def _config(preprocessor_config: Mapping[str, Any] | Idefics3ImageConfig) -> Idefics3ImageConfig:
    """A parsed config as is (parse once per model), a preprocessor_config.json dict parsed."""
    if isinstance(preprocessor_config, Idefics3ImageConfig):
        return preprocessor_config
    return Idefics3ImageConfig.from_preprocessor_config(preprocessor_config)


def process_image(image: Image.Image,
                  preprocessor_config: Mapping[str, Any] | Idefics3ImageConfig) -> Idefics3Image:
    """One RGB image -> its tiles (and global image), rescaled and normalized."""
    require_rgb(image)
    config = _config(preprocessor_config)
    tile, resample = config.tile_side, config.resample
    if config.do_resize:
        if config.longest_edge:
            size = _longest_edge_size(image.height, image.width, config.longest_edge)
        else:
            size = (config.resize_height, config.resize_width)
        image = _resize(image, *size, resample)

    rows = cols = 0
    if config.do_image_splitting:
        image = _resize(image, *_tile_multiple_size(image.height, image.width, tile), resample)
        if image.height > tile or image.width > tile:
            rows = (image.height - tile) // tile + 1
            cols = (image.width - tile) // tile + 1
            pixels = np.asarray(image)  # [H, W, 3] uint8
            frames = [pixels[r * tile:(r + 1) * tile, c * tile:(c + 1) * tile]
                      for r in range(rows) for c in range(cols)]
            frames.append(np.asarray(_resize(image, tile, tile, resample)))
        else:
            frames = [np.asarray(image)]
    else:
        frames = [np.asarray(_resize(image, tile, tile, resample))]

    tiles = [_rescale_and_normalize(frame.transpose(2, 0, 1), config) for frame in frames]  # [3, h, w] each
    pixel_values, pixel_attention_mask = _pad_tiles(tiles, *_max_height_width(tiles), len(tiles))
    return Idefics3Image(pixel_values=pixel_values, pixel_attention_mask=pixel_attention_mask, rows=rows, cols=cols)


def _rescale_and_normalize(pixels: np.ndarray, config: Idefics3ImageConfig) -> np.ndarray:
    """``pixels [3, h, w]`` uint8 -> float32, rounded as transformers' numpy path rounds."""
    if config.do_rescale:
        pixels = (pixels.astype(np.float64) * config.rescale_factor).astype(np.float32)
    pixels = pixels.astype(np.float32, copy=False)
    if config.do_normalize:
        mean = np.asarray(config.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(config.image_std, dtype=np.float32)[:, None, None]
        pixels = (pixels - mean) / std
    return pixels


def _max_height_width(tiles: Sequence[np.ndarray]) -> tuple[int, int]:
    return max(t.shape[-2] for t in tiles), max(t.shape[-1] for t in tiles)


def _pad_tiles(tiles: Sequence[np.ndarray], height: int, width: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-pad each tile at the bottom/right and the list with empty tiles up to ``count``."""
    values = np.zeros((count, 3, height, width), dtype=np.float32)  # [count, 3, H, W]
    mask = np.zeros((count, height, width), dtype=np.int64)  # [count, H, W]
    for index, t in enumerate(tiles):
        values[index, :, :t.shape[-2], :t.shape[-1]] = t
        mask[index, :t.shape[-2], :t.shape[-1]] = 1
    return values, mask


def pad_batch(images: Sequence[Idefics3Image]) -> tuple[np.ndarray, np.ndarray]:
    """One image per sample -> ``pixel_values [B, max_tiles, 3, H, W]``, ``pixel_attention_mask [B, max_tiles, H, W]``.

    Samples with fewer tiles get all-zero tiles with an all-zero mask (the model skips them).
    """
    if not images:
        raise ValueError("pad_batch needs at least one image")
    count = max(i.pixel_values.shape[0] for i in images)
    height = max(i.pixel_values.shape[-2] for i in images)
    width = max(i.pixel_values.shape[-1] for i in images)
    values = np.zeros((len(images), count, 3, height, width), dtype=np.float32)  # [B, max_tiles, 3, H, W]
    mask = np.zeros((len(images), count, height, width), dtype=np.int64)  # [B, max_tiles, H, W]
    for b, image in enumerate(images):
        tiles, _, h, w = image.pixel_values.shape
        values[b, :tiles, :, :h, :w] = image.pixel_values
        mask[b, :tiles, :h, :w] = image.pixel_attention_mask
    return values, mask


def image_placeholder(rows: int, cols: int, image_seq_len: int) -> str:
    """The text that replaces one ``<image>`` in the prompt."""
    if image_seq_len <= 0:
        raise ValueError(f"image_seq_len must be positive, got {image_seq_len}")
    global_block = f"{FAKE_IMAGE_TOKEN}{GLOBAL_IMAGE_TOKEN}{IMAGE_TOKEN * image_seq_len}{FAKE_IMAGE_TOKEN}"
    if rows == 0 and cols == 0:
        return global_block
    grid = "".join(
        "".join(f"{FAKE_IMAGE_TOKEN}<row_{r + 1}_col_{c + 1}>{IMAGE_TOKEN * image_seq_len}" for c in range(cols)) + "\n"
        for r in range(rows))
    return f"{grid}\n{global_block}"


def expand_image_prompt(rows: int, cols: int, image_seq_len: int, prompt: str = COLMODERNVBERT_VISUAL_PROMPT) -> str:
    """The document prompt with its one ``<image>`` expanded for a ``rows`` x ``cols`` split image."""
    if prompt.count(IMAGE_TOKEN) != 1:
        raise ValueError(f"prompt must hold exactly one {IMAGE_TOKEN}, found {prompt.count(IMAGE_TOKEN)}")
    return prompt.replace(IMAGE_TOKEN, image_placeholder(rows, cols, image_seq_len))


def num_image_tokens(rows: int, cols: int, image_seq_len: int, newline_tokens: int = 1,
                     double_newline_tokens: int = 1) -> int:
    """Tokens ``image_placeholder`` becomes, every tag being one special token.

    The text between tags is "\\n" after each row but the last and "\\n\\n" before the global
    block; ``newline_tokens`` / ``double_newline_tokens`` are what the tokenizer makes of those
    (byte-level BPE: 1 and 1 when it merges "\\n\\n"; WordPiece drops whitespace: 0 and 0).
    """
    global_block = image_seq_len + 3
    if rows == 0 and cols == 0:
        return global_block
    return global_block + rows * cols * (image_seq_len + 2) + (rows - 1) * newline_tokens + double_newline_tokens
