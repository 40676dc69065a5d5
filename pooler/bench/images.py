"""Seeded images made at run time for the image workloads, as encoded files (what users send):
- page-like: a white page with a title bar, lines of dark "words" (short boxes), a table grid
  and a grey figure box, saved as PNG, at letter / A4 sizes of 100-150 dpi and a screenshot;
- photo-like: smooth colour gradients, blurred blobs and sensor noise, saved as JPEG
  (quality 90), at common camera and web sizes.
Half of each, sizes cycling, so every side decodes and resizes the same mix.
"""
from __future__ import annotations

import io

import numpy as np

PAGE_SIZES = ((850, 1100), (1240, 1754), (1275, 1650), (1280, 800))   # (width, height)
PHOTO_SIZES = ((640, 480), (1024, 768), (1920, 1080), (500, 375), (768, 1024))
TINY_SIZES = ((48, 64), (80, 60))


def _page(rng: np.random.Generator, width: int, height: int):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    margin = width // 12
    draw.rectangle([margin, margin, width - margin, margin + height // 30], fill=(30, 30, 80))
    y = margin + height // 20
    line = max(6, height // 90)
    while y < height - margin:
        block = rng.integers(0, 10)
        if block == 0:  # a grey figure
            h = int(height * rng.uniform(0.1, 0.2))
            draw.rectangle([margin, y, width - margin, y + h],
                           fill=tuple(int(c) for c in rng.integers(150, 230, 3)))
            y += h + line
        elif block == 1:  # a table grid
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(2, 6))
            cell_w, cell_h = (width - 2 * margin) // cols, 2 * line
            for r in range(rows + 1):
                draw.line([margin, y + r * cell_h, margin + cols * cell_w, y + r * cell_h],
                          fill=(0, 0, 0))
            for c in range(cols + 1):
                draw.line([margin + c * cell_w, y, margin + c * cell_w, y + rows * cell_h],
                          fill=(0, 0, 0))
            y += rows * cell_h + line
        else:  # a line of words
            x = margin
            while x < width - margin:
                w = int(rng.integers(line, 6 * line))
                draw.rectangle([x, y, min(x + w, width - margin), y + line - 2],
                               fill=(int(rng.integers(0, 60)),) * 3)
                x += w + line // 2
            y += int(line * 1.8)
    return image


def _photo(rng: np.random.Generator, width: int, height: int):
    from PIL import Image, ImageFilter

    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 255, (2, 3)).astype(np.float32)
    t = (xx / width * rng.uniform(0.3, 1) + yy / height * rng.uniform(0.3, 1))[..., None]
    array = base[0] * (1 - t / 2) + base[1] * (t / 2)  # [H, W, 3] gradient
    for _ in range(6):  # soft blobs
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        radius = rng.uniform(0.05, 0.3) * min(width, height)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * radius ** 2))[..., None]
        array = array * (1 - blob) + rng.uniform(0, 255, 3).astype(np.float32) * blob
    array += rng.normal(0, 6, array.shape).astype(np.float32)  # sensor noise
    image = Image.fromarray(np.clip(array, 0, 255).astype(np.uint8), "RGB")
    return image.filter(ImageFilter.GaussianBlur(0.8))


def bench_images(count: int, seed: int = 0, tiny: bool = False) -> list[bytes]:
    """`count` encoded images, pages (PNG) and photos (JPEG) alternating, sizes cycling."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        page = i % 2 == 0
        sizes = TINY_SIZES if tiny else (PAGE_SIZES if page else PHOTO_SIZES)
        width, height = sizes[(i // 2) % len(sizes)]
        image = (_page if page else _photo)(rng, width, height)
        buffer = io.BytesIO()
        if page:
            image.save(buffer, format="PNG")
        else:
            image.save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


CAPTION_WORDS = ("a photo of the cat dog red blue car tree house sky sea small big green one "
                 "two three on in with and under over running sleeping bird fish page table "
                 "chart report figure invoice street city mountain river night").split()


def bench_captions(count: int, seed: int = 1) -> list[str]:
    """Short caption-like texts of 5-16 words (what image-text models embed as queries)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(CAPTION_WORDS, int(rng.integers(5, 17))))
            for _ in range(count)]


def bench_pages(count: int, seed: int = 0, tiny: bool = False) -> list[bytes]:
    """`count` page-like PNGs (letter / A4 sizes at 100-150 dpi and a screenshot, cycling):
    the documents of the visual retrieval workload."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        sizes = TINY_SIZES if tiny else PAGE_SIZES
        buffer = io.BytesIO()
        _page(rng, *sizes[i % len(sizes)]).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


QUERY_WORDS = ("which page shows the quarterly revenue chart table of operating costs by region "
               "invoice total for march board members risk factors cash flow summary").split()


def bench_queries(count: int, seed: int = 2) -> list[str]:
    """Short search queries of 4-10 words (what users ask a page index)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(QUERY_WORDS, int(rng.integers(4, 11))))
            for _ in range(count)]
