"""Image preprocessing equal to transformers' PIL-backend image processors, in numpy and PIL.

Read from the model folder's `preprocessor_config.json`:
- CLIP (`CLIPImageProcessor`): resize the shortest edge (bicubic), center crop, rescale,
  normalize -> pixel_values [3, H, W].
- SigLIP (`SiglipImageProcessor`): resize to a fixed height x width, rescale, normalize.
- SigLIP2 (`Siglip2ImageProcessor`, NaFlex): resize to the largest size with at most
  `max_num_patches` patches (sides multiples of the patch size, aspect ratio kept), rescale,
  normalize, cut into patches -> pixel_values [num_patches, patch * patch * 3] and
  spatial_shapes (patch rows, patch columns). transformers pads the patches to max_num_patches
  and returns a pixel_attention_mask; pooler keeps only the real patches (the model masks the
  padding out anyway), and `padded()` rebuilds transformers' form.

Each step does what transformers' numpy helpers do, in their order and dtypes (uint8 resize
through PIL, rescale in float64 then float32, normalize in float32), so outputs agree to the
last bit (tests/multimodal/test_image_processing_parity.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
IMAGENET_STANDARD_MEAN = [0.5, 0.5, 0.5]
IMAGENET_STANDARD_STD = [0.5, 0.5, 0.5]

# image_processor_type (any Fast / Pil suffix dropped) -> pooler's processor kind
PROCESSOR_KINDS = {"CLIPImageProcessor": "clip", "SiglipImageProcessor": "siglip",
                   "Siglip2ImageProcessor": "siglip2"}


@dataclass
class ProcessedImage:
    """What the vision tower takes for one image."""
    pixel_values: np.ndarray  # clip/siglip: [3, H, W] float32; siglip2: [patches, p*p*3]
    spatial_shape: tuple[int, int] | None = None  # siglip2: (patch rows, patch columns)

    @property
    def nbytes(self) -> int:
        return int(self.pixel_values.nbytes)

    def padded(self, max_num_patches: int) -> tuple[np.ndarray, np.ndarray]:
        """siglip2: transformers' padded patches [max_num_patches, d] and mask [max]."""
        n = self.pixel_values.shape[0]
        out = np.zeros((max_num_patches, self.pixel_values.shape[1]), np.float32)
        out[:n] = self.pixel_values
        mask = np.zeros(max_num_patches, np.int32)
        mask[:n] = 1
        return out, mask


@dataclass
class ImageProcessorSpec:
    kind: str  # "clip" | "siglip" | "siglip2"
    do_resize: bool = True
    size: dict[str, int] = field(default_factory=dict)
    resample: int = 3  # PIL.Image.Resampling value (3 = BICUBIC, 2 = BILINEAR)
    do_center_crop: bool = False
    crop_size: dict[str, int] = field(default_factory=dict)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: list[float] = field(default_factory=lambda: list(IMAGENET_STANDARD_MEAN))
    image_std: list[float] = field(default_factory=lambda: list(IMAGENET_STANDARD_STD))
    patch_size: int = 16           # siglip2
    max_num_patches: int = 256     # siglip2

    @property
    def signature(self) -> str:
        """Identifies the output for a given image (part of the mm cache key)."""
        return repr(sorted(self.__dict__.items()))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ImageProcessorSpec":
        kind_name = str(d.get("image_processor_type") or "")
        for suffix in ("Fast", "Pil"):
            kind_name = kind_name.removesuffix(suffix)
        kind = PROCESSOR_KINDS.get(kind_name)
        if kind is None:
            raise ValueError(f"preprocessor_config.json names image_processor_type "
                             f"{d.get('image_processor_type')!r}, which pooler does not "
                             f"implement; supported: {sorted(PROCESSOR_KINDS)}.")
        defaults = _DEFAULTS[kind]
        merged = {**defaults, **{k: v for k, v in d.items() if v is not None}}
        size = merged.get("size")
        if isinstance(size, int):  # old configs: an int is the shortest edge (CLIP)
            size = {"shortest_edge": size} if kind == "clip" else {"height": size, "width": size}
        crop = merged.get("crop_size")
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        mean, std = merged["image_mean"], merged["image_std"]
        return cls(kind=kind, do_resize=bool(merged["do_resize"]), size=dict(size or {}),
                   resample=int(merged["resample"]),
                   do_center_crop=bool(merged.get("do_center_crop", False)),
                   crop_size=dict(crop or {}), do_rescale=bool(merged["do_rescale"]),
                   rescale_factor=float(merged["rescale_factor"]),
                   do_normalize=bool(merged["do_normalize"]),
                   image_mean=list(mean) if isinstance(mean, (list, tuple)) else [mean] * 3,
                   image_std=list(std) if isinstance(std, (list, tuple)) else [std] * 3,
                   patch_size=int(merged.get("patch_size", 16)),
                   max_num_patches=int(merged.get("max_num_patches", 256)))

    @classmethod
    def from_folder(cls, path: Path) -> "ImageProcessorSpec":
        import json

        file = Path(path) / "preprocessor_config.json"
        if not file.is_file():
            raise FileNotFoundError(f"{path} has no preprocessor_config.json, which says how "
                                    "images are resized and normalized for this model.")
        return cls.from_dict(json.loads(file.read_text()))

    # ---- processing ---------------------------------------------------------------------
    def num_patches(self, image: ProcessedImage, patch_size: int) -> int:
        if self.kind == "siglip2":
            return int(image.pixel_values.shape[0])
        _, height, width = image.pixel_values.shape
        return (height // patch_size) * (width // patch_size)

    def __call__(self, rgb_image) -> ProcessedImage:
        """An RGB PIL image -> ProcessedImage."""
        if self.kind == "siglip2":
            return self._naflex(rgb_image)
        image = rgb_image
        if self.do_resize:
            image = image.resize(_resized_wh(image.size, self.size), resample=self.resample)
        array = np.asarray(image).transpose(2, 0, 1)  # [3, H, W] uint8
        if self.do_center_crop:
            array = _center_crop(array, self.crop_size["height"], self.crop_size["width"])
        return ProcessedImage(self._rescale_normalize(array))

    def _naflex(self, rgb_image) -> ProcessedImage:
        width, height = rgb_image.size
        image = rgb_image
        if self.do_resize:
            new_h, new_w = size_for_max_num_patches(height, width, self.patch_size,
                                                    self.max_num_patches)
            image = image.resize((new_w, new_h), resample=self.resample)
        array = self._rescale_normalize(np.asarray(image).transpose(2, 0, 1))  # [3, H, W]
        p = self.patch_size
        channels, h, w = array.shape
        rows, cols = h // p, w // p
        patches = array.reshape(channels, rows, p, cols, p).transpose(1, 3, 2, 4, 0)
        return ProcessedImage(np.ascontiguousarray(patches.reshape(rows * cols, -1)),
                              (rows, cols))

    def _rescale_normalize(self, array: np.ndarray) -> np.ndarray:
        if self.do_rescale:  # transformers: float64 product, then float32
            array = (array.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            if not np.issubdtype(array.dtype, np.floating):
                array = array.astype(np.float32)
            mean = np.array(self.image_mean, dtype=array.dtype)
            std = np.array(self.image_std, dtype=array.dtype)
            array = ((array.T - mean) / std).T
        return np.ascontiguousarray(array, dtype=np.float32)


_DEFAULTS: dict[str, dict[str, Any]] = {
    "clip": dict(do_resize=True, size={"shortest_edge": 224}, resample=3, do_center_crop=True,
                 crop_size={"height": 224, "width": 224}, do_rescale=True,
                 rescale_factor=1 / 255, do_normalize=True, image_mean=OPENAI_CLIP_MEAN,
                 image_std=OPENAI_CLIP_STD),
    "siglip": dict(do_resize=True, size={"height": 224, "width": 224}, resample=3,
                   do_center_crop=False, do_rescale=True, rescale_factor=1 / 255,
                   do_normalize=True, image_mean=IMAGENET_STANDARD_MEAN,
                   image_std=IMAGENET_STANDARD_STD),
    "siglip2": dict(do_resize=True, size=None, resample=2, do_rescale=True,
                    rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5, 0.5, 0.5],
                    image_std=[0.5, 0.5, 0.5], patch_size=16, max_num_patches=256),
}


def _resized_wh(size_wh: tuple[int, int], size: dict[str, int]) -> tuple[int, int]:
    """(width, height) after resize, as transformers computes it."""
    width, height = size_wh
    if size.get("shortest_edge") and not size.get("longest_edge"):
        target = int(size["shortest_edge"])
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = target, int(target * long / short)
        new_h, new_w = (new_long, new_short) if width <= height else (new_short, new_long)
        return new_w, new_h
    if size.get("height") and size.get("width"):
        return int(size["width"]), int(size["height"])
    raise ValueError(f"preprocessor_config.json: size {size} is not supported (expected "
                     "'shortest_edge' or 'height' and 'width').")


def _center_crop(array: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """transformers' center_crop on [C, H, W], zero-padding an image smaller than the crop."""
    _, height, width = array.shape
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    bottom, right = top + crop_h, left + crop_w
    if top >= 0 and bottom <= height and left >= 0 and right <= width:
        return array[:, top:bottom, left:right]
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    padded = np.zeros((array.shape[0], new_h, new_w), dtype=array.dtype)
    top_pad, left_pad = math.ceil((new_h - height) / 2), math.ceil((new_w - width) / 2)
    padded[:, top_pad:top_pad + height, left_pad:left_pad + width] = array
    top, bottom, left, right = top + top_pad, bottom + top_pad, left + left_pad, right + left_pad
    return padded[:, max(0, top):min(new_h, bottom), max(0, left):min(new_w, right)]


def size_for_max_num_patches(height: int, width: int, patch_size: int, max_num_patches: int,
                             eps: float = 1e-5) -> tuple[int, int]:
    """SigLIP2's target (height, width): a binary search for the largest scale whose
    patch-aligned size has at most max_num_patches patches (transformers' own search)."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) \
                <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)
