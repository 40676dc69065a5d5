"""Images named in HTTP requests -> decoded images the Engine takes, fetched and decoded off the
event loop, in parallel for a request's images.

Each dialect turns its own shape (vLLM's `image_url` parts, Cohere's `images` and
`inputs[].content`) into `ImageRef`s that say where in the body they came from
(`messages[0].content[1]`, `documents[2].content[0]`, `images[0]`), and hands the request's items
to `resolve_items`, which replaces every ref with a PIL RGB image. The routes then call the
Engine's front doors (`embed`, `encode`, `score`) with those items, as the offline API does.

Where an image may come from:
- `data:image/<type>;base64,...`: always;
- `http(s)://`: fetched by pooler/multimodal/fetch.py within --media-fetch-timeout seconds and
  --max-image-bytes; hosts that resolve to private, loopback or link-local addresses are refused
  unless the server runs with --allow-private-media-urls;
- `file://` URLs: only with --allowed-local-media-path DIR (vLLM's flag), only under DIR.
A bad image is a 400 naming the item and the fix; one request's bad image never touches
another request's.
"""
from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pooler.multimodal.fetch import fetch_image_bytes
from pooler.multimodal.media import (ImageInputError, MediaLimits, decode_bytes, read_data_url,
                                     read_image_file)
from pooler.server.errors import bad_request
from pooler.server.settings import ServerSettings


@dataclass(frozen=True)
class ImageRef:
    """An image named by URL, not fetched yet; `field[index]` is where the body holds it."""
    url: str
    field: str
    index: int

    @property
    def where(self) -> str:
        return f"{self.field}[{self.index}]"


@dataclass(frozen=True)
class ResolvedImage:
    image: Any           # PIL.Image.Image, mode RGB
    format: str          # of the encoded image: "png", "jpeg", ...
    bit_depth: int       # bits per channel of the encoded image

    @property
    def width(self) -> int:
        return self.image.size[0]

    @property
    def height(self) -> int:
        return self.image.size[1]


def takes_images(engine) -> bool:
    """Whether the served model takes images: the Engine's image side (`Engine.image_side`:
    an image-text model's or a page retrieval model's)."""
    return getattr(engine, "image_side", getattr(engine, "images", None)) is not None


def text_only_refusal(engine, ref: ImageRef):
    """The 400 for an image sent to a text-only model, before anything is fetched."""
    return bad_request(
        f"{ref.where} is an image, but {engine.model_config.architecture} is a text-only "
        "model; send text, or serve an image model (CLIP, SigLIP, SigLIP2, ColModernVBert, "
        "ColPali, ColQwen2).", ref.field.split("[")[0].split(".")[0])


class MediaResolver:
    """The server's image side: its limits, its URL policy and its worker threads."""

    def __init__(self, settings: ServerSettings):
        self.limits = MediaLimits(max_bytes=settings.max_image_bytes)
        self.timeout = settings.media_fetch_timeout
        self.allow_private = settings.allow_private_media_urls
        self.allowed_dir = settings.allowed_local_media_path
        self.executor = ThreadPoolExecutor(settings.media_workers,
                                           thread_name_prefix="pooler-media")

    def load(self, ref: ImageRef) -> ResolvedImage:
        """Fetch (or read) and decode one image; ImageInputError names `ref.where`."""
        data = self._bytes(ref)
        decoded = decode_bytes(data, ref.index, limits=self.limits, field=ref.field)
        from PIL import Image

        header = Image.open(io.BytesIO(data))  # the header only: format and mode
        return ResolvedImage(decoded.image, (header.format or "").lower(),
                             _bit_depth(header.mode))

    def _bytes(self, ref: ImageRef) -> bytes:
        url = ref.url
        scheme = urlsplit(url).scheme.lower()
        if scheme == "data":
            return read_data_url(url, ref.index, limits=self.limits, field=ref.field)
        if scheme in ("http", "https"):
            return fetch_image_bytes(url, ref.index, max_bytes=self.limits.max_bytes,
                                     timeout=self.timeout, allow_private=self.allow_private,
                                     field=ref.field)
        if scheme == "file":
            if self.allowed_dir is None:
                raise ImageInputError(
                    f"{ref.where}: file:// URLs are off on this server; send the image as a "
                    "data: URL, or start the server with --allowed-local-media-path DIR.")
            parts = urlsplit(url)
            if parts.netloc not in ("", "localhost"):
                raise ImageInputError(f"{ref.where}: a file:// URL names a file on this "
                                      f"machine, not on {parts.netloc!r}.")
            return read_image_file(unquote(parts.path), ref.index, limits=self.limits,
                                   allowed_dir=self.allowed_dir, field=ref.field)
        raise ImageInputError(
            f"{ref.where}: {url[:60]!r} is not an image URL; send "
            "'data:image/<type>;base64,<data>', an http(s):// URL or (where the server allows "
            "it) a file:// URL.")

    async def resolve(self, refs: list[ImageRef]) -> list[ResolvedImage]:
        """All of `refs`, loaded in parallel on the media threads. The first bad one (in body
        order) is a 400 naming it, once every load has ended (each is time-bounded)."""
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(self.executor, self.load, ref) for ref in refs),
            return_exceptions=True)
        for ref, result in zip(refs, results):
            if isinstance(result, ImageInputError):
                raise bad_request(str(result), ref.field.split("[")[0].split(".")[0],
                                  code="invalid_image")
            if isinstance(result, BaseException):
                raise result
        return list(results)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _bit_depth(mode: str) -> int:
    if mode == "1":
        return 1
    if mode.startswith("I;16"):
        return 16
    if mode in ("I", "F"):
        return 32
    return 8


# ---- items that hold refs -------------------------------------------------------------------
def refs_in(items: list) -> list[ImageRef]:
    """The refs of a request's Engine items: an item itself, or vLLM's offline form
    {"prompt": ..., "multi_modal_data": {"image": ref}}."""
    out = []
    for item in items:
        if isinstance(item, ImageRef):
            out.append(item)
        elif isinstance(item, dict) and isinstance(
                (item.get("multi_modal_data") or {}).get("image"), ImageRef):
            out.append(item["multi_modal_data"]["image"])
    return out


async def resolve_items(resolver: MediaResolver, items: list
                        ) -> tuple[list, dict[ImageRef, ResolvedImage]]:
    """`items` with every ref replaced by its decoded image, and what each ref became."""
    refs = refs_in(items)
    if not refs:
        return items, {}
    resolved = dict(zip(refs, await resolver.resolve(refs)))
    out = []
    for item in items:
        if isinstance(item, ImageRef):
            out.append(resolved[item].image)
        elif isinstance(item, dict) and item.get("multi_modal_data", {}).get("image") in resolved:
            out.append({**item, "multi_modal_data": {
                "image": resolved[item["multi_modal_data"]["image"]].image}})
        else:
            out.append(item)
    return out, resolved


def content_item(engine, parts: list, field: str, *, separator: str = "\n"):
    """One item from a list of content parts (vLLM's chat / ScoreMultiModalParam parts,
    Cohere's inputs[].content): its text, an ImageRef for one image, or vLLM's offline form
    {"prompt": text, "multi_modal_data": {"image": ref}} for both (the Engine decides whether
    the model takes that). `field` is where the parts sit ("documents[0].content")."""
    texts, images = [], []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            images.append(ImageRef(_image_url(part, f"{field}[{j}]"), field, j))
        elif kind == "image_embeds":
            raise bad_request(f"{field}[{j}]: image_embeds (precomputed vision embeddings) are "
                              "not accepted; send the image itself as an image_url part.",
                              field.split("[")[0])
        else:
            raise bad_request(
                f"{field}[{j}] is a {kind!r} part; parts are {{'type': 'text', 'text': ...}} "
                "or {'type': 'image_url', 'image_url': {'url': ...}}.", field.split("[")[0])
    if images and not takes_images(engine):
        raise text_only_refusal(engine, images[0])
    if len(images) > 1:
        raise bad_request(f"{field} has {len(images)} images; one item takes one image: send "
                          "them as separate items.", field.split("[")[0])
    if not images:
        if not texts:
            raise bad_request(f"{field} is empty: pass a text or an image part.",
                              field.split("[")[0])
        return separator.join(texts)
    if texts:
        return {"prompt": separator.join(texts), "multi_modal_data": {"image": images[0]}}
    return images[0]


def _image_url(part: dict, where: str) -> str:
    """{"image_url": {"url": ...}} (OpenAI, vLLM, Cohere's SDK) or {"image_url": "..."}."""
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}: an image_url part needs image_url.url, a data:, http(s):// "
                          "or file:// URL.", where.split("[")[0])
    return value
