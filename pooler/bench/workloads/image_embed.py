"""Image embedding: images/s of a two-tower model (CLIP ViT-B/32, SigLIP base/16 shapes, seeded
weights: pooler/bench/image_folders.py) on seeded page-like PNGs and photo-like JPEGs of many
sizes (pooler/bench/images.py), encoded bytes in, embeddings out, and briefly texts/s of the
text tower on short captions.

Libraries: pooler (`Engine.embed`), transformers (`get_image_features` / `get_text_features`
after its own image processor and tokenizer, batches of 32) and sentence-transformers
(`encode`, batch 32, which loads these folders as multimodal Transformer modules). All three
run in ONE process per model, timed in alternating rounds (the order rotates each round), so
drift on a shared machine reaches every library alike; each row's images/s is its median
round and the lines under the table give the ratios round by round.

Phases (medians over rounds, per image): decode (encoded bytes -> RGB image; pooler's also
hashes the pixels for its caches), preprocess (resize, crop, rescale, normalize) and model
(the rest of the call: the vision tower with batching around it). transformers' phases are
timed in its pipeline; pooler's and sentence-transformers' calls do everything inside, so their
decode and preprocess are timed by separate passes of the same code over the same images, and
model is the call's time minus them. pooler's image caches are cleared before every round.

% ceiling: the vision tower's FLOPs (image_folders.vision_flops_per_image) per second of the
whole call, as a share of the fp32 GEMM ceiling; the lines under the table give the same over
the model phase alone (the tower's own share).
"""
from __future__ import annotations

import io
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np

from pooler.bench.common import pooler_engine, save_array
from pooler.bench.image_folders import (IMAGE_MODELS, image_folder, text_length,
                                        vision_flops_per_image, vision_tokens_per_image)
from pooler.bench.images import bench_captions, bench_images
from pooler.bench.machine import rss_mb
from pooler.bench.registry import BenchOptions, Side, SideResult, Workload, register

DEFAULT_IMAGES = 32
DEFAULT_TEXTS = 64
PEER_BATCH = 32
LIBRARIES = ("pooler", "transformers", "st")


def rounds(opts: BenchOptions) -> int:
    """--interleaved-rounds (default 3; 1 with --quick)."""
    value = opts.extra.get("interleaved_rounds")
    return max(1, int(value)) if value else (1 if opts.quick else 3)


def _inputs(opts: BenchOptions) -> tuple[list[bytes], list[str]]:
    count = 4 if opts.quick else int(opts.extra.get("corpus_size") or DEFAULT_IMAGES)
    return bench_images(count, seed=0, tiny=opts.quick), \
        bench_captions(8 if opts.quick else DEFAULT_TEXTS)


def _decode_rgb(data: bytes):
    """What a peer's user does with an encoded image: PIL open, decode, RGB."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.load()
    return image.convert("RGB")


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


class _Timer:
    """Seconds by phase over one round."""

    def __init__(self):
        self.phases: dict[str, float] = {}

    def time(self, phase: str, fn: Callable[[], object]):
        start = time.perf_counter()
        out = fn()
        self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - start
        return out


# ---- the three libraries: images(bytes) -> ([n, dim], phases, seconds of the call itself)
# and texts -> [n, dim] ---------------------------------------------------------------------
class _Pooler:
    role = "pooler"

    def __init__(self, path: Path, opts: BenchOptions):
        self.engine = pooler_engine(path, opts)

    def images(self, data: list[bytes]) -> tuple[np.ndarray, dict[str, float], float]:
        from pooler.multimodal.media import load_image

        self.engine.reset_encoder_cache()  # every round computes every image
        self.engine.reset_mm_cache()
        start = time.perf_counter()
        out = self.engine.embed(data, use_tqdm=False)
        total = time.perf_counter() - start
        # The same decode and preprocessing code again, timed apart (outside the call).
        timer = _Timer()
        decoded = timer.time("decode", lambda: [load_image(b, i) for i, b in enumerate(data)])
        timer.time("preprocess", lambda: [self.engine.images.spec(d.image) for d in decoded])
        phases = {**timer.phases, "model": max(0.0, total - sum(timer.phases.values()))}
        return np.stack([o.embedding for o in out]), phases, total

    def texts(self, texts: list[str]) -> np.ndarray:
        return np.stack([o.embedding for o in self.engine.embed(texts, use_tqdm=False)])


class _Transformers:
    role = "peer"

    def __init__(self, path: Path, opts: BenchOptions, name: str):
        import torch
        import transformers

        model_class = transformers.CLIPModel if name == "clip" else transformers.SiglipModel
        self.model = model_class.from_pretrained(str(path), dtype=torch.float32).eval()
        self.processor = transformers.AutoImageProcessor.from_pretrained(str(path))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        self.pad_to = text_length(name, opts.quick)
        self.note = f"{type(self.processor).__name__}, batch {PEER_BATCH}"

    @staticmethod
    def _pooled(out):
        return getattr(out, "pooler_output", out)  # transformers 5: an output with pooler_output

    def images(self, data: list[bytes]) -> tuple[np.ndarray, dict[str, float], float]:
        import torch

        start = time.perf_counter()
        timer = _Timer()
        decoded = timer.time("decode", lambda: [_decode_rgb(b) for b in data])
        outs = []
        with torch.inference_mode():
            for batch in _batches(decoded, PEER_BATCH):
                pixels = timer.time("preprocess", lambda: self.processor(
                    images=batch, return_tensors="pt")["pixel_values"])
                outs.append(timer.time("model", lambda: self._pooled(
                    self.model.get_image_features(pixel_values=pixels))))
        emb = torch.cat(outs).numpy()
        return emb, timer.phases, time.perf_counter() - start

    def texts(self, texts: list[str]) -> np.ndarray:
        import torch

        padding = {"padding": "max_length", "max_length": self.pad_to} if self.pad_to else \
            {"padding": True}
        outs = []
        with torch.inference_mode():
            for batch in _batches(texts, PEER_BATCH):
                enc = self.tokenizer(batch, return_tensors="pt", truncation=True, **padding)
                outs.append(self._pooled(self.model.get_text_features(**enc)))
        return torch.cat(outs).numpy()


class _SentenceTransformers:
    role = "peer"

    def __init__(self, path: Path, opts: BenchOptions, name: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device="cpu")
        self.note = f"encode, batch {PEER_BATCH}"

    def images(self, data: list[bytes]) -> tuple[np.ndarray, dict[str, float], float]:
        import torch

        timer = _Timer()
        decoded = timer.time("decode", lambda: [_decode_rgb(b) for b in data])
        start = time.perf_counter()
        emb = self.model.encode(decoded, batch_size=PEER_BATCH, convert_to_numpy=True)
        encode = time.perf_counter() - start
        total = timer.phases["decode"] + encode
        with torch.inference_mode():  # its preprocessing again, timed apart
            timer.time("preprocess", lambda: [self.model.preprocess(b)
                                              for b in _batches(decoded, PEER_BATCH)])
        timer.phases["model"] = max(0.0, encode - timer.phases["preprocess"])
        return np.asarray(emb), timer.phases, total

    def texts(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.model.encode(texts, batch_size=PEER_BATCH,
                                            convert_to_numpy=True))


def _load(library: str, path: Path, opts: BenchOptions, name: str):
    if library == "pooler":
        return _Pooler(path, opts)
    if library == "transformers":
        return _Transformers(path, opts, name)
    return _SentenceTransformers(path, opts, name)


# ---- one process per model: every library, alternating rounds ------------------------------
def row_name(model: str, library: str, text: bool = False) -> str:
    return f"{model} {'text ' if text else ''}{library}"


def _text_tokens(path: Path, texts: list[str]) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return sum(len(ids) for ids in tokenizer(texts)["input_ids"])


def _model_side(name: str):
    def run(opts: BenchOptions) -> list[SideResult]:
        path = image_folder(name, tiny=opts.quick)
        hf_config = json.loads((path / "config.json").read_text())
        data, texts = _inputs(opts)
        flops = vision_flops_per_image(hf_config)
        tokens = vision_tokens_per_image(hf_config)
        libs, failed, loaded = {}, {}, {}
        for library in LIBRARIES:
            before = rss_mb()
            try:
                lib = _load(library, path, opts, name)
                lib.images(data[:2])  # warm up kernels and allocator
                lib.texts(texts[:4])
            except Exception as exc:  # noqa: BLE001 - reported in the table, others still run
                failed[library] = f"{type(exc).__name__}: {exc}"
                continue
            libs[library], loaded[library] = lib, rss_mb() - before
        image_s = {k: [] for k in libs}
        text_s = {k: [] for k in libs}
        phases = {k: [] for k in libs}
        outputs, text_outputs = {}, {}
        order = list(libs)
        for index in range(rounds(opts)):
            turn = order[index % len(order):] + order[:index % len(order)] if order else []
            for library in turn:  # images, then texts, each library in turn
                outputs[library], round_phases, seconds = libs[library].images(data)
                image_s[library].append(seconds)
                phases[library].append(round_phases)
                start = time.perf_counter()
                text_outputs[library] = libs[library].texts(texts)
                text_s[library].append(time.perf_counter() - start)
        text_tokens = _text_tokens(path, texts) if libs else 0
        results = []
        for library in LIBRARIES:
            if library in failed:
                for text in (False, True):
                    results.append(SideResult(row_name(name, library, text),
                                              "pooler" if library == "pooler" else "peer",
                                              error=failed[library][:300]))
                continue
            lib = libs[library]
            median_phases = {p: statistics.median(r[p] for r in phases[library])
                             for p in phases[library][0]}
            seconds = statistics.median(image_s[library])
            note = ", ".join(f"{p} {1e3 * s / len(data):.1f}" for p, s in median_phases.items())
            note = f"ms/image: {note}" + (f"; {lib.note}" if getattr(lib, "note", "") else "")
            results.append(SideResult(
                row_name(name, library), lib.role, len(data), tokens * len(data), seconds,
                loaded_rss_mb=loaded[library], note=note, phases_s=median_phases,
                model_flops=flops * len(data),
                rounds_per_s=[len(data) / s for s in image_s[library]],
                outputs_file=save_array(opts, f"image_embed-{name}-{library}",
                                        outputs[library])))
            results.append(SideResult(
                row_name(name, library, True), lib.role, len(texts), text_tokens,
                statistics.median(text_s[library]), loaded_rss_mb=loaded[library],
                rounds_per_s=[len(texts) / s for s in text_s[library]],
                note=f"{len(texts)} captions of 5-16 words",
                outputs_file=save_array(opts, f"image_embed-{name}-text-{library}",
                                        text_outputs[library])))
        return results
    return run


def selected_models(opts: BenchOptions) -> list[str]:
    names = opts.extra.get("image_models") or list(IMAGE_MODELS)
    unknown = [n for n in names if n not in IMAGE_MODELS]
    if unknown:
        raise ValueError(f"image models: unknown {unknown}; choose from {list(IMAGE_MODELS)}.")
    return names


def _sides(opts: BenchOptions) -> list[Side]:
    return [Side(name, "pooler", _model_side(name)) for name in selected_models(opts)]


def report_lines(rows) -> list[str]:
    """Per model: pooler's ratio to each peer round by round (same process, alternating), each
    library's phases per image, and the vision tower's share of the fp32 GEMM ceiling."""
    lines = []
    by_side = {r.side: r for r in rows if not r.error}
    for model in IMAGE_MODELS:
        for text in (False, True):
            pooler = by_side.get(row_name(model, "pooler", text))
            if pooler is None:
                continue
            what = "texts" if text else "images"
            for peer in ("transformers", "st"):
                other = by_side.get(row_name(model, peer, text))
                if other is None or not other.rounds_per_s:
                    continue
                per_round = [a / b for a, b in zip(pooler.rounds_per_s, other.rounds_per_s)]
                lines.append(
                    f"image_embed: {pooler.side} vs {other.side}: "
                    f"{statistics.median(per_round):.2f}x {what}/s (median of "
                    f"{len(per_round)} alternating round(s) in one process: "
                    + ", ".join(f"{x:.2f}" for x in per_round) + ")")
        for library in LIBRARIES:
            row = by_side.get(row_name(model, library))
            if row is None or not row.phases_s or not row.texts_per_s:
                continue
            n = row.texts_per_s * row.seconds
            split = ", ".join(f"{p} {1e3 * s / n:.1f} ms ({100 * s / row.seconds:.0f}%)"
                              for p, s in row.phases_s.items())
            tower = ""
            if row.model_ceiling_pct is not None:
                gflops = row.model_flops / row.phases_s["model"] / 1e9
                tower = (f"; vision tower {row.model_flops / n / 1e9:.2f} GFLOP/image at "
                         f"{gflops:.0f} GFLOP/s over the model phase = "
                         f"{row.model_ceiling_pct:.0f}% of the fp32 GEMM ceiling "
                         f"({row.ceiling_pct:.0f}% end to end)")
            lines.append(f"image_embed: {row.side} per image: {split}{tower}")
    return lines


register(Workload(
    name="image_embed",
    description="embed page-like PNGs and photo-like JPEGs (images/s) and captions with "
                "CLIP ViT-B/32 and SigLIP base/16 shapes: pooler vs transformers vs "
                "sentence-transformers, alternating rounds in one process",
    metric="throughput", sides=_sides, baseline="",
    baselines={row_name(m, lib, text): row_name(m, "transformers", text)
               for m in IMAGE_MODELS for lib in ("pooler", "st") for text in (False, True)},
    report_lines=report_lines))
