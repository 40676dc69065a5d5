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
