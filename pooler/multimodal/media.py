"""One image item in, one RGB PIL image and its content hash out, within limits.

Accepted items: a PIL image, a `pathlib.Path` (or `{"image": "/a/path"}`), raw bytes, a
`data:image/...;base64,` URL, `{"image": <any of these>}`, or vLLM's offline form
`{"prompt": "", "multi_modal_data": {"image": <any of these>}}`. A plain string is never read as a
path: `Engine.embed("cat.png")` embeds the text "cat.png". A server passes `allowed_dir` so that
a client can only name files under one folder; the offline API reads any path its caller names.

Conversion to RGB is transformers' (`image_transforms.convert_to_rgb`, which its processors run
with do_convert_rgb): an image with an alpha band or a `transparency` entry is composited onto
white, every other mode (L, P, CMYK, I;16, ...) goes through PIL's convert("RGB"). Files and
bytes get their EXIF orientation applied first, as transformers' `load_image` does.

The content hash is of the decoded RGB pixels plus the size (not of the encoded bytes): the
same picture sent as PNG bytes, as a path or as a PIL image shares one cache entry, and two
encodings that decode to the same pixels are the same input to the model.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Formats accepted from files, bytes and data URLs (what image APIs take; PIL opens many more,
# some through external programs).
SUPPORTED_FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF")


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 20 * 2**20       # encoded size of one image
    max_pixels: int = 89_478_485      # width * height (PIL's own bomb threshold)


DEFAULT_LIMITS = MediaLimits()


class ImageInputError(ValueError):
    """A bad image item; the message names its index and the fix."""


@dataclass(frozen=True)
class DecodedImage:
    image: Any          # PIL.Image.Image in mode RGB
    content_hash: str   # hex sha256 of size + RGB pixels

    @property
    def size(self) -> tuple[int, int]:  # (width, height)
        return self.image.size


def _pil():
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - pillow is a dependency
        raise ImportError("image inputs need Pillow: pip install pillow") from exc
    return Image


def is_image_item(item: Any) -> bool:
    """Whether `item` is an image (as opposed to a text or token ids)."""
    if isinstance(item, (bytes, bytearray, memoryview, Path)):
        return True
    if isinstance(item, dict):
        return "image" in item or "image" in (item.get("multi_modal_data") or {})
    if isinstance(item, str):
        return item.startswith("data:image/")
    return type(item).__module__.startswith("PIL.") and hasattr(item, "getbands")


def to_rgb(image):
    """transformers' convert_to_rgb on a PIL image: alpha composited onto white."""
    Image = _pil()
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def require_rgb(image) -> None:
    """ValueError unless `image` is a PIL image in mode RGB (what the processors take)."""
    Image = _pil()
    if not isinstance(image, Image.Image) or image.mode != "RGB":
        kind = (f"a PIL image in mode {image.mode!r}" if isinstance(image, Image.Image)
                else type(image).__name__)
        raise ValueError(f"image must be an RGB PIL image, got {kind}: convert it first "
                         "(image.convert('RGB'))")


def content_hash(rgb_image) -> str:
    # sha256: the SHA extensions of every CPU kind pooler is measured on (Zen 3, Zen 4,
    # Sapphire Rapids) make it ~4x faster than blake2b on a page's pixels (16 vs 62 ms for
    # 1240 x 1754, Xeon AMX, 2026-12-06).
    digest = hashlib.sha256()
    digest.update(f"{rgb_image.size[0]}x{rgb_image.size[1]}:".encode())
    digest.update(rgb_image.tobytes())
    return digest.hexdigest()


def load_image(item: Any, index: int = 0, *, limits: MediaLimits = DEFAULT_LIMITS,
               allowed_dir: str | os.PathLike | None = None,
               field: str = "inputs") -> DecodedImage:
    """Decode one image item (see the module docstring) to RGB and hash it."""
    where = f"{field}[{index}]"
    if isinstance(item, dict) and "multi_modal_data" in item:  # vLLM's offline prompt form
        if item.get("prompt"):
            raise ImageInputError(f"{where} has both a prompt and an image; an image-text "
                                  "model embeds one or the other: send them as two inputs.")
        item = item["multi_modal_data"]
    if isinstance(item, dict):
        if "image" not in item:
            raise ImageInputError(f"{where} is a dict without an 'image' key.")
        item = item["image"]
        if isinstance(item, str) and not item.startswith("data:"):
            item = Path(item)  # {"image": "/a/file.png"} names a file
    Image = _pil()
    if isinstance(item, Image.Image):
        _check_pixels(item.size, limits, where)
        try:
            item.load()
        except OSError as exc:
            raise ImageInputError(f"{where}: the image could not be read ({exc}).") from None
        rgb = to_rgb(item)
        return DecodedImage(rgb, content_hash(rgb))
    if isinstance(item, Path):
        data = _read_file(item, limits, allowed_dir, where)
    elif isinstance(item, str) and item.startswith("data:"):
        data = _decode_data_url(item, limits, where)
    elif isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
    else:
        raise ImageInputError(
            f"{where} is a {type(item).__name__}; an image item is a PIL image, a "
            "pathlib.Path, bytes, a 'data:image/...;base64,' URL or {'image': ...}.")
    return decode_bytes(data, index, limits=limits, field=field)


def decode_bytes(data: bytes, index: int = 0, *, limits: MediaLimits = DEFAULT_LIMITS,
                 field: str = "inputs") -> DecodedImage:
    """Encoded image bytes to RGB, refusing what is over the limits or not an image."""
    where = f"{field}[{index}]"
    if len(data) > limits.max_bytes:
        raise ImageInputError(f"{where} is {len(data)} bytes, over the limit of "
                              f"{limits.max_bytes} bytes; send a smaller image.")
    Image = _pil()
    from PIL import ImageOps, UnidentifiedImageError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in SUPPORTED_FORMATS:
                raise ImageInputError(
                    f"{where} is a {image.format} image, which is not supported; send one of "
                    f"{', '.join(SUPPORTED_FORMATS)}.")
            _check_pixels(image.size, limits, where)  # before decoding a single pixel
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # no copy of the pixels
    except ImageInputError:
        raise
    except UnidentifiedImageError:
        raise ImageInputError(f"{where} is not an image (no known image format in its "
                              f"{len(data)} bytes).") from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageInputError(f"{where} was refused as a decompression bomb ({exc}).") from None
    except (OSError, SyntaxError, ValueError) as exc:
        # PIL says "image file is truncated" / "broken data stream" for cut files.
        raise ImageInputError(f"{where} could not be decoded: the file is truncated or "
                              f"corrupt ({exc}).") from None
    rgb = to_rgb(image)
    return DecodedImage(rgb, content_hash(rgb))


def _check_pixels(size: tuple[int, int], limits: MediaLimits, where: str) -> None:
    width, height = size
    if width * height > limits.max_pixels:
        raise ImageInputError(
            f"{where} is {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_pixels} (a decompression bomb guard); send a smaller image.")
    if width == 0 or height == 0:
        raise ImageInputError(f"{where} has no pixels ({width}x{height}).")


def _read_file(path: Path, limits: MediaLimits, allowed_dir, where: str) -> bytes:
    resolved = path.expanduser().resolve()
    if allowed_dir is not None:
        root = Path(allowed_dir).resolve()
        if not resolved.is_relative_to(root):
            raise ImageInputError(f"{where}: {str(path)!r} is outside the allowed media "
                                  f"folder {str(root)!r}.")
    if not resolved.is_file():
        raise ImageInputError(f"{where}: no image file at {str(path)!r}.")
    size = resolved.stat().st_size
    if size > limits.max_bytes:
        raise ImageInputError(f"{where}: {str(path)!r} is {size} bytes, over the limit of "
                              f"{limits.max_bytes} bytes.")
    return resolved.read_bytes()


def _decode_data_url(url: str, limits: MediaLimits, where: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise ImageInputError(f"{where} is a data URL but not 'data:image/<type>;base64,<data>'.")
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise ImageInputError(f"{where}: the data URL holds more than {limits.max_bytes} bytes.")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(f"{where}: the data URL's base64 payload is invalid.") from None


def read_data_url(url: str, index: int = 0, *, limits: MediaLimits = DEFAULT_LIMITS,
                  field: str = "inputs") -> bytes:
    """The encoded image bytes of a 'data:image/<type>;base64,' URL (a server decodes them
    itself, on its media threads)."""
    return _decode_data_url(url, limits, f"{field}[{index}]")


def read_image_file(path: str | os.PathLike, index: int = 0, *,
                    limits: MediaLimits = DEFAULT_LIMITS,
                    allowed_dir: str | os.PathLike | None = None,
                    field: str = "inputs") -> bytes:
    """The bytes of an image file, refused outside `allowed_dir` or over the byte limit."""
    return _read_file(Path(path), limits, allowed_dir, f"{field}[{index}]")
