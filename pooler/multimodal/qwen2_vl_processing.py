"""Qwen2-VL image preprocessing (ColQwen2's page images), in numpy + Pillow.

Qwen2-VL keeps an image near its own resolution: both sides are rounded to a multiple of
``patch_size * merge_size`` with the pixel count held in ``[min_pixels, max_pixels]``. The image
is then rescaled, normalized, repeated ``temporal_patch_size`` times (a still image is a one-frame
video to the vision tower) and cut into flattened patches ordered so that each
``merge_size x merge_size`` block of neighbouring patches is contiguous (the merger folds them
into one language-model token). Mirrors transformers' ``Qwen2VLImageProcessorPil`` and the prompt
expansion of ``ColQwen2Processor``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from PIL import Image

from pooler.multimodal.media import require_rgb

# The defaults of transformers' Qwen2VLImageProcessor, used where a config leaves a key out.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT_RATIO = 200

IMAGE_PAD_TOKEN = "<|image_pad|>"
COLQWEN2_VISUAL_PROMPT = (
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>"
)


@dataclass(frozen=True)
class Qwen2VLImageConfig:
    """The preprocessor_config.json keys that shape a Qwen2-VL image."""

    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    resample: int = int(Image.Resampling.BICUBIC)
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any]) -> "Qwen2VLImageConfig":
        """Read a preprocessor_config.json dict; top-level min/max_pixels win over ``size``."""
        size = config.get("size") or {}
        min_pixels = config.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", DEFAULT_MIN_PIXELS)))
        max_pixels = config.get("max_pixels", size.get("longest_edge", size.get("max_pixels", DEFAULT_MAX_PIXELS)))
        made = cls(
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            patch_size=int(config.get("patch_size", 14)),
            temporal_patch_size=int(config.get("temporal_patch_size", 2)),
            merge_size=int(config.get("merge_size", 2)),
            resample=int(config.get("resample", Image.Resampling.BICUBIC)),
            do_resize=bool(config.get("do_resize", True)),
            do_rescale=bool(config.get("do_rescale", True)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
            do_normalize=bool(config.get("do_normalize", True)),
            image_mean=_per_channel(config.get("image_mean", OPENAI_CLIP_MEAN), "image_mean"),
            image_std=_per_channel(config.get("image_std", OPENAI_CLIP_STD), "image_std"),
        )
        for field in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"):
            if getattr(made, field) <= 0:
                raise ValueError(f"preprocessor config {field} must be positive, got {getattr(made, field)}")
        if made.min_pixels > made.max_pixels:
            raise ValueError(f"preprocessor config min_pixels ({made.min_pixels}) exceeds "
                             f"max_pixels ({made.max_pixels})")
        return made


@dataclass(frozen=True)
class Qwen2VLImage:
    pixel_values: np.ndarray  # [grid_h * grid_w, C * temporal_patch_size * patch_size * patch_size] float32
    image_grid_thw: np.ndarray  # [3] int64: (grid_t=1, grid_h, grid_w) in patches
    num_image_tokens: int  # grid_t * grid_h * grid_w // merge_size**2 placeholders in the prompt


def _per_channel(value: float | list[float], name: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * 3
    if len(values) != 3:
        raise ValueError(f"preprocessor config {name} must have 3 values (R, G, B), got {list(values)}")
    return values


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image aspect ratio must be below {MAX_ASPECT_RATIO}:1, got {width}x{height} pixels")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _config(preprocessor_config: Mapping[str, Any] | Qwen2VLImageConfig) -> Qwen2VLImageConfig:
    """A parsed config as is (parse once per model), a preprocessor_config.json dict parsed."""
    if isinstance(preprocessor_config, Qwen2VLImageConfig):
        return preprocessor_config
    return Qwen2VLImageConfig.from_preprocessor_config(preprocessor_config)


def process_image(image: Image.Image,
                  preprocessor_config: Mapping[str, Any] | Qwen2VLImageConfig) -> Qwen2VLImage:
    """One RGB image -> flattened patches and grid, as Qwen2-VL's vision tower takes them."""
    require_rgb(image)
    config = _config(preprocessor_config)
    patch, merge, temporal = config.patch_size, config.merge_size, config.temporal_patch_size
    if config.do_resize:
        height, width = smart_resize(image.height, image.width, patch * merge, config.min_pixels, config.max_pixels)
        image = image.resize((width, height), resample=config.resample)
    pixels = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
    if config.do_rescale:
        # float64 product then float32, as transformers rounds it
        pixels = (pixels.astype(np.float64) * config.rescale_factor).astype(np.float32)
    pixels = pixels.astype(np.float32, copy=False)
    if config.do_normalize:
        mean = np.asarray(config.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(config.image_std, dtype=np.float32)[:, None, None]
        pixels = (pixels - mean) / std
    channels, height, width = pixels.shape
    if height % (patch * merge) or width % (patch * merge):
        raise ValueError(f"image of {width}x{height} pixels is not a multiple of patch_size * merge_size "
                         f"({patch * merge}); keep do_resize on")
    grid_h, grid_w = height // patch, width // patch
    blocks = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, P, P]
    # A still image fills every temporal slot with the same frame.
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal, patch, patch))
    flat = frames.reshape(grid_h * grid_w, channels * temporal * patch * patch)  # [num_patches, C*T*P*P]
    return Qwen2VLImage(
        pixel_values=np.ascontiguousarray(flat),
        image_grid_thw=np.array([1, grid_h, grid_w], dtype=np.int64),
        num_image_tokens=grid_h * grid_w // (merge * merge),
    )


def num_image_tokens(height: int, width: int,
                     preprocessor_config: Mapping[str, Any] | Qwen2VLImageConfig) -> int:
    """Placeholder tokens an image of ``height`` x ``width`` pixels takes, without decoding it."""
    config = _config(preprocessor_config)
    factor = config.patch_size * config.merge_size
    if config.do_resize:
        height, width = smart_resize(height, width, factor, config.min_pixels, config.max_pixels)
    return (height // config.patch_size) * (width // config.patch_size) // config.merge_size**2


def expand_image_prompt(num_tokens: int, prompt: str = COLQWEN2_VISUAL_PROMPT,
                        image_token: str = IMAGE_PAD_TOKEN) -> str:
    """The document prompt with its one image placeholder repeated ``num_tokens`` times."""
    if prompt.count(image_token) != 1:
        raise ValueError(f"prompt must hold exactly one {image_token}, found {prompt.count(image_token)}")
    return prompt.replace(image_token, image_token * num_tokens)
