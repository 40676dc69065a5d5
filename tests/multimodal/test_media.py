"""Image items: every accepted form decodes to the same pixels and hash; bad items fail with
an error naming their index."""
from __future__ import annotations

import base64
import re
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pooler.multimodal.media import (ImageInputError, MediaLimits, is_image_item, load_image)


def _png(width=20, height=10, seed=0, mode="RGB") -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.convert(mode).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_form_gives_the_same_pixels_and_hash(tmp_path):
    data = _png()
    path = tmp_path / "a.png"
    path.write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    forms = [data, path, {"image": str(path)}, url, {"image": url}, Image.open(io.BytesIO(data))]
    decoded = [load_image(f, i) for i, f in enumerate(forms)]
    assert len({d.content_hash for d in decoded}) == 1
    assert all(np.array_equal(np.asarray(d.image), np.asarray(decoded[0].image)) for d in decoded)
    assert load_image(_png(seed=1)).content_hash != decoded[0].content_hash


def test_plain_strings_are_text_not_paths():
    assert not is_image_item("cat.png")
    assert is_image_item(Path("cat.png")) and is_image_item(b"x") and is_image_item({"image": 1})
    assert is_image_item("data:image/png;base64,AAAA")


@pytest.mark.parametrize("item, message", [
    (b"not an image at all", "inputs[3] is not an image"),
    (_png()[:60], "inputs[3] could not be decoded: the file is truncated"),
    ("data:image/png;base64,@@@", "inputs[3]: the data URL's base64 payload is invalid"),
    (12, "inputs[3] is a int"),
])
def test_bad_items_name_their_index(item, message):
    with pytest.raises(ImageInputError, match=re.escape(message)):
        load_image(item, 3)


def test_limits():
    with pytest.raises(ImageInputError, match=r"inputs\[0\] is \d+ bytes, over the limit of 100"):
        load_image(_png(), limits=MediaLimits(max_bytes=100))
    with pytest.raises(ImageInputError, match="20x10 = 200 pixels, over the limit of 199"):
        load_image(_png(), limits=MediaLimits(max_pixels=199))
    with pytest.raises(ImageInputError, match="over the limit of 199"):
        load_image(Image.new("RGB", (20, 10)), limits=MediaLimits(max_pixels=199))


def test_unsupported_format():
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="PPM")
    with pytest.raises(ImageInputError, match="is a PPM image, which is not supported"):
        load_image(buffer.getvalue())


def test_allowed_dir(tmp_path):
    inside = tmp_path / "media"
    inside.mkdir()
    (inside / "a.png").write_bytes(_png())
    (tmp_path / "b.png").write_bytes(_png())
    assert load_image(inside / "a.png", allowed_dir=inside).size == (20, 10)
    with pytest.raises(ImageInputError, match="outside the allowed media folder"):
        load_image(inside / ".." / "b.png", allowed_dir=inside)
    with pytest.raises(ImageInputError, match="no image file at"):
        load_image(tmp_path / "missing.png")


def test_vllm_multi_modal_data_form():
    data = _png()
    item = {"prompt": "", "multi_modal_data": {"image": data}}
    assert is_image_item(item)
    assert load_image(item).content_hash == load_image(data).content_hash
    with pytest.raises(ImageInputError, match=r"inputs\[1\] has both a prompt and an image"):
        load_image({"prompt": "a cat", "multi_modal_data": {"image": data}}, 1)
    assert not is_image_item({"prompt": "a cat"})


def test_exif_orientation_is_applied():
    # A 4 x 2 JPEG whose EXIF says "rotate 90 degrees clockwise to display" (orientation 6)
    # decodes as 2 x 4, as a viewer (and transformers' load_image) shows it.
    image = Image.new("RGB", (4, 2), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif)
    decoded = load_image(buffer.getvalue())
    assert decoded.image.size == (2, 4)
    plain = io.BytesIO()
    image.save(plain, format="JPEG")
    assert load_image(plain.getvalue()).image.size == (4, 2)
