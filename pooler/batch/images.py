"""Image columns of corpus jobs (`pooler batch --image-column`, on one machine and on Ray Data).

A cell holds one image:
- a string: an image file's path, absolute or relative to the image root (`--image-root`;
  default: the folder of the corpus file), or a `data:image/<type>;base64,` URL (how a JSONL
  corpus carries the bytes themselves);
- bytes: the encoded file (a Parquet binary column);
- a {"bytes", "path"} struct, as Hugging Face datasets' Image feature writes Parquet: its
  bytes when set, else its path.
http(s) URLs are not fetched: a corpus job reads local (or mounted) files.

Two-tower models (CLIP, SigLIP, SigLIP2) embed the images (`--task embed`); page retrieval
models (ColModernVBert, ColPali, ColQwen2) give each page its multi-vector (`--task
token_embed`, Engine.token_embed = encode_documents). Every row's image is decoded on its own
before the engine sees it, so a bad one (a missing file, not an image, truncated, over the
size or pixel limits) is that row's error and no other row's; images are decoded and run
GROUP_ROWS at a time, so what is held is one group's pixels, whatever the chunk size.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from pooler.batch.columns import TaskOptions, compute_columns
from pooler.multimodal.media import DEFAULT_LIMITS, ImageInputError, load_image

IMAGE_TASKS = ("embed", "token_embed")
# Images decoded at once (and handed to the engine in one call): enough for full batches of
# the vision tower, few enough that 32 decoded scans (~15 MB each) stay well under 1 GB.
GROUP_ROWS = 32


def check_image_task(task: str) -> None:
    if task not in IMAGE_TASKS:
        raise ValueError(f"--image-column runs --task embed (image-text models: CLIP, SigLIP) "
                         f"or --task token_embed (page retrieval models: ColModernVBert, "
                         f"ColPali, ColQwen2), not --task {task}.")


def default_image_root(input: str) -> str | None:
    """Where relative image paths are read from when --image-root is not given: the corpus
    file's folder (a corpus directory itself); None for an object-store URI."""
    if "://" in input:
        return None
    path = Path(input).resolve()
    return str(path if path.is_dir() else path.parent)


def image_item(cell: Any, root: str | None) -> tuple[Any, str | None]:
    """One cell -> (an image item Engine.embed takes, None), or (None, why the row cannot
    run)."""
    if isinstance(cell, dict) and cell and set(cell) <= {"bytes", "path"}:
        cell = cell.get("bytes") if cell.get("bytes") is not None else cell.get("path")
    if cell is None:
        return None, "null image"
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return (bytes(cell), None) if len(cell) else (None, "empty image bytes")
    if not isinstance(cell, str):
        return None, f"image is a {type(cell).__name__}, not a file path or bytes"
    if not cell.strip():
        return None, "empty image path"
    if cell.startswith("data:"):
        return cell, None
    if "://" in cell:
        return None, (f"image {cell!r} is a URL; pooler batch reads image files and bytes, not "
                      "URLs: download them first")
    path = Path(cell).expanduser()
    if not path.is_absolute():
        if root is None:
            return None, (f"relative image path {cell!r} and no folder to read it from (the "
                          "input is not a local file): pass --image-root or absolute paths")
        path = Path(root) / path
    return path, None


def compute_image_rows(engine, items: list, labels: list, opts: TaskOptions, column: str
                       ) -> tuple[dict[str, pa.Array] | None, list[int], dict[int, str]]:
    """Run image items (from image_item) through the engine.

    labels: what names each item in an error (the input row number, or the id on Ray), as
    `column[label]`. Returns the task's columns for the items that ran, their positions in
    `items` (ascending), and {position: why} for those that did not."""
    limits = _limits(engine)
    parts: list[dict[str, pa.Array]] = []
    kept: list[int] = []
    failed: dict[int, str] = {}
    for start in range(0, len(items), GROUP_ROWS):
        images, at = [], []
        for i in range(start, min(start + GROUP_ROWS, len(items))):
            try:
                images.append(load_image(items[i], labels[i], limits=limits,
                                         field=column).image)
                at.append(i)
            except ImageInputError as exc:
                failed[i] = str(exc)
        if not images:
            continue
        try:
            parts.append(compute_columns(engine, images, opts))
            kept += at
        except Exception:  # noqa: BLE001 - find the images the engine rejects, keep the others
            for i, image in zip(at, images):
                try:
                    parts.append(compute_columns(engine, [image], opts))
                    kept.append(i)
                except Exception as exc:  # noqa: BLE001 - that row's error
                    failed[i] = _named(f"{type(exc).__name__}: {exc}", f"{column}[{labels[i]}]")
        del images  # one group's pixels at a time
    if not parts:
        return None, [], failed
    return {name: pa.concat_arrays([p[name] for p in parts]) for name in parts[0]}, kept, failed


def check_image_model(engine, task: str) -> None:
    """One clear line when the model cannot take the image column for `task`."""
    check_image_config(engine.model_config, task)


def check_image_config(model_config, task: str) -> None:
    """check_image_model from the model's config alone (a Ray driver checks before any actor
    loads the model: an actor failing to start would only show as Ray's traceback)."""
    architecture = model_config.architecture
    pages = getattr(model_config, "pages", None) is not None
    two_tower = getattr(model_config, "two_tower", None) is not None
    if pages and task != "token_embed":
        raise ValueError(f"{architecture} is a page retrieval model: each page is a "
                         "multi-vector; run it with --task token_embed.")
    if two_tower and task != "embed":
        raise ValueError(f"{architecture} is an image-text model with one vector per image; "
                         "run it with --task embed.")
    if not pages and not two_tower:
        raise ValueError(f"{architecture} is a text-only model: --image-column needs an "
                         "image-text model (CLIPModel, SiglipModel, Siglip2Model) or a page "
                         "retrieval model (ColModernVBertForRetrieval, ColPali, ColQwen2).")


def _named(message: str, where: str) -> str:
    """The engine names a lone item `inputs[0]`; name the row instead."""
    return message.replace("inputs[0]", where, 1)


def _limits(engine):
    side = getattr(engine, "images", None) or getattr(engine, "pages", None)
    return side.limits if side is not None else DEFAULT_LIMITS
