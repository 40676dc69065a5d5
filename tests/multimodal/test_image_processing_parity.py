"""pooler's numpy/PIL preprocessing equals transformers' PIL-backend image processors."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pooler.multimodal.image_processing import ImageProcessorSpec, size_for_max_num_patches
from pooler.multimodal.media import load_image

transformers = pytest.importorskip("transformers")

# (width, height, mode): portrait, landscape, tiny, odd sizes, and every mode to convert.
CASES = [(224, 224, "RGB"), (640, 480, "RGB"), (97, 301, "L"), (33, 17, "RGBA"),
         (300, 200, "P"), (150, 151, "LA"), (80, 120, "CMYK"), (64, 40, "I;16"),
         (500, 13, "RGB"), (7, 9, "RGBA")]


def _image(width: int, height: int, mode: str, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        pixels = rng.integers(0, 65535, (height, width), dtype=np.uint16).astype("<u2")
        return Image.frombytes("I;16", (width, height), pixels.tobytes())
    channels = {"L": 1, "LA": 2, "P": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode]
    data = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    if mode in ("L", "P"):
        image = Image.fromarray(data[..., 0], "L")
        return image.convert("P") if mode == "P" else image
    return Image.frombytes(mode, (width, height), data.tobytes())


PROCESSORS = {
    "clip": ("CLIPImageProcessorPil", dict(size={"shortest_edge": 48},
                                           crop_size={"height": 40, "width": 44})),
    "clip_defaults": ("CLIPImageProcessorPil", {}),
    "siglip": ("SiglipImageProcessorPil", dict(size={"height": 32, "width": 48})),
    # Siglip2 leaves do_convert_rgb unset (a grayscale image then fails in transformers);
    # pooler always converts, as with it set.
    "siglip2": ("Siglip2ImageProcessorPil", dict(patch_size=8, max_num_patches=50,
                                                 do_convert_rgb=True)),
}


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_pixel_values_equal_transformers(name):
    cls_name, kwargs = PROCESSORS[name]
    reference = getattr(transformers, cls_name)(**kwargs)
    spec = ImageProcessorSpec.from_dict(reference.to_dict())
    worst = 0.0
    for seed, (width, height, mode) in enumerate(CASES):
        image = _image(width, height, mode, seed)
        expected = reference(images=image, return_tensors="np")
        ours = spec(load_image(image).image)
        if spec.kind == "siglip2":
            padded, mask = ours.padded(spec.max_num_patches)
            assert np.array_equal(mask, expected["pixel_attention_mask"][0])
            assert tuple(expected["spatial_shapes"][0]) == ours.spatial_shape
            got, want = padded, expected["pixel_values"][0]
        else:
            got, want = ours.pixel_values, expected["pixel_values"][0]
        assert got.shape == want.shape, (width, height, mode)
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-5, worst


def test_rgba_is_composited_on_white_like_transformers():
    transparent = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    rgb = load_image(transparent).image
    assert rgb.mode == "RGB" and rgb.getpixel((0, 0)) == (255, 255, 255)


def test_naflex_size_matches_transformers_search():
    from transformers.models.siglip2.image_processing_pil_siglip2 import \
        get_image_size_for_max_num_patches
    for h, w in [(1, 1), (224, 224), (1000, 37), (37, 1000), (333, 777)]:
        for p, n in [(16, 256), (14, 1024), (8, 50)]:
            assert size_for_max_num_patches(h, w, p, n) == \
                get_image_size_for_max_num_patches(h, w, p, n)


def test_legacy_clip_feature_extractor_config():
    """openai/clip-vit-base-patch32's preprocessor_config.json: int sizes, and only the old
    CLIPFeatureExtractor named."""
    legacy = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
              "feature_extractor_type": "CLIPFeatureExtractor",
              "image_mean": [0.48145466, 0.4578275, 0.40821073],
              "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3, "size": 224}
    spec = ImageProcessorSpec.from_dict(legacy)
    assert spec.kind == "clip" and spec.size == {"shortest_edge": 224}
    kwargs = {k: v for k, v in legacy.items() if k != "feature_extractor_type"}
    reference = transformers.CLIPImageProcessorPil(**kwargs)
    for seed, (width, height, mode) in enumerate(CASES[:4]):
        image = _image(width, height, mode, seed)
        want = reference(images=image, return_tensors="np")["pixel_values"][0]
        assert np.abs(spec(load_image(image).image).pixel_values - want).max() <= 1e-5
    unnamed = {k: v for k, v in legacy.items() if k != "feature_extractor_type"}
    assert ImageProcessorSpec.from_dict(unnamed, default_kind="clip").kind == "clip"
    with pytest.raises(ValueError, match="does not implement"):
        ImageProcessorSpec.from_dict({"image_processor_type": "Idefics3ImageProcessor"})
