"""Image and text inputs of two-tower image-text models (CLIP, SigLIP, SigLIP2) for `embed`
and `score`: the input side of issue 41.

Images are decoded and hashed (pooler/multimodal/media.py), preprocessed once per content
hash (the multimodal input cache, `ImageInputs.cache`, cleared by `Engine.reset_mm_cache`)
and submitted as image requests charged their patch count against the step's token budget;
the model runner's image path embeds them through the vision tower and its encoder cache
(pooler/worker/image_runner.py). Texts are tokenized as the reference processor does
(SigLIP: padded to the tower's length, pooler/multimodal/two_tower.py) and run through the
text tower. Both land in one embedding space; `score` is their cosine similarity (raw, as
sentence-transformers' CLIP gives it: `logit_scale` / `logit_bias` are not applied).
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np

from pooler.engine.input_processor import ProcessedInput, TruncationOptions, normalize_inputs
from pooler.engine.request import RequestOutput
from pooler.engine.tasks.pairs import pairing
from pooler.multimodal.cache import ByteLRUCache, CacheStats
from pooler.multimodal.image_processing import ImageProcessorSpec
from pooler.multimodal.inputs import ImageRequestData
from pooler.multimodal.media import DEFAULT_LIMITS, MediaLimits, is_image_item, load_image
from pooler.outputs import ScoreOutput, as_numpy
from pooler.params import PoolingParams

# Default multimodal input cache: 256 MiB holds ~1,300 preprocessed 224 x 224 images
# (602 KB each in float32) or ~330 at 448 x 448.
DEFAULT_MM_CACHE_BYTES = 256 * 2**20


class ImageInputs:
    """An engine's image side: the processor spec, the mm cache and the media limits."""

    def __init__(self, model_config, cache_bytes: int = DEFAULT_MM_CACHE_BYTES,
                 limits: MediaLimits = DEFAULT_LIMITS, allowed_dir: str | None = None):
        self.layout = model_config.two_tower
        self.spec = ImageProcessorSpec.from_folder(model_config.path, self.layout.kind)
        self.cache = ByteLRUCache(cache_bytes)
        self.limits = limits
        self.allowed_dir = allowed_dir  # a server sets it; the offline API reads any path

    @classmethod
    def for_engine(cls, engine) -> "ImageInputs | None":
        """The engine's image side (None for text models), its cache registered with the
        model runner so that reset_mm_cache and reload_weights reach it."""
        if getattr(engine.model_config, "two_tower", None) is None:
            return None
        inputs = cls(engine.model_config)
        engine.core.model_runner.mm_cache = inputs.cache
        return inputs

    def process_image(self, item: Any, index: int, field: str = "inputs") -> ProcessedInput:
        decoded = load_image(item, index, limits=self.limits, allowed_dir=self.allowed_dir,
                             field=field)
        key = (decoded.content_hash, self.spec.signature)
        processed = self.cache.get(key)
        if processed is None:
            processed = self.spec(decoded.image)
            self.cache.put(key, processed, processed.nbytes)
        num_tokens = self.spec.num_patches(processed, self.layout.vision_patch_size) + \
            int(self.layout.class_token)
        return ProcessedInput(prompt_token_ids=[], extra={"image": ImageRequestData(
            decoded.content_hash, processed, num_tokens)})


def num_tokens(p: ProcessedInput) -> int:
    """What a processed input costs the token budget: its tokens, or its image's patches."""
    image = p.extra.get("image")
    return image.num_tokens if image is not None else len(p.prompt_token_ids)


def has_images(*inputs: Any) -> bool:
    for value in inputs:
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(is_image_item(item) for item in items):
            return True
    return False


def handles(engine, *inputs: Any) -> bool:
    """Whether embed/score calls go through this module: every call of a two-tower model,
    and calls with images (which then fail with one clear error on a text model)."""
    return getattr(engine, "images", None) is not None or has_images(*inputs)


def _require_image_model(engine, field: str, index: int) -> None:
    if getattr(engine, "images", None) is None:
        raise ValueError(
            f"{field}[{index}] is an image, but {engine.model_config.architecture} is a "
            "text-only model; image inputs need an image-text model (CLIPModel, SiglipModel, "
            "Siglip2Model) or a page retrieval model (ColModernVBertForRetrieval).")


def _items(inputs: Any) -> list:
    if isinstance(inputs, (list, tuple)) and not (
            inputs and all(isinstance(x, int) and not isinstance(x, bool) for x in inputs)):
        return list(inputs)
    return [inputs]


def process(engine, inputs: Any, params: PoolingParams, truncation: TruncationOptions,
            field: str = "inputs") -> tuple[list[ProcessedInput], list[PoolingParams]]:
    """Texts and images (in any order) -> processed inputs and their params, in order."""
    items = _items(inputs)
    if not items:
        raise ValueError(f"{field} is empty: pass at least one text or image.")
    image_at = [i for i, item in enumerate(items) if is_image_item(item)]
    for i in image_at:
        _require_image_model(engine, field, i)
    processed: list[ProcessedInput | None] = [None] * len(items)
    all_params = [params] * len(items)
    for i in image_at:
        processed[i] = engine.images.process_image(items[i], i, field)
    images = set(image_at)
    text_at = [i for i in range(len(items)) if i not in images]
    if text_at:
        texts = [normalize_inputs([items[i]], field)[0] for i in text_at]
        for i, p in zip(text_at, engine.processor.process(texts, truncation=truncation)):
            processed[i], all_params[i] = _pad_text(engine, p, params)
    return processed, all_params


def _pad_text(engine, p: ProcessedInput, params: PoolingParams
              ) -> tuple[ProcessedInput, PoolingParams]:
    """SigLIP: pad to the text tower's length as the reference processor does (masked)."""
    layout = engine.model_config.two_tower
    if layout is None or layout.pad_text_to is None:
        return p, params
    pads = layout.pad_text_to - len(p.prompt_token_ids)
    if pads <= 0:
        return p, params
    params = params.clone()
    if layout.padding_side == "left":  # dropped: positions start after them
        params.extra = {**params.extra, "position_offset": pads}
        return p, params
    text_config = engine.model_config.hf_config.get("text_config") or {}
    pad_id = text_config.get("pad_token_id")
    if pad_id is None:
        pad_id = engine.tokenizer.special_token_id("pad_token") or 0
    params.extra = {**params.extra, "num_unattended_suffix": pads}
    return replace(p, prompt_token_ids=list(p.prompt_token_ids) + [int(pad_id)] * pads,
                   token_type_ids=None, special_tokens_mask=None), params


def encode(engine, inputs: Any, params: PoolingParams, truncation: TruncationOptions,
           use_tqdm: bool | None, priority: int, *, cancel: threading.Event | None = None,
           unsupported: dict[str, Any] | None = None, field: str = "inputs"
           ) -> list[RequestOutput]:
    """Run texts and images of one call; results in input order."""
    for name, value in (unsupported or {}).items():
        if value not in (None, False):
            raise ValueError(f"{name}={value!r} is not supported for image-text models "
                             f"({engine.model_config.architecture}); leave it unset.")
    params = engine.verify_params(params)
    processed, all_params = process(engine, inputs, params, truncation, field)
    return engine.run_processed(processed, all_params, priority, use_tqdm, cancel=cancel)


def score(engine, queries: Any, documents: Any, *, truncation: TruncationOptions,
          use_tqdm: bool | None = None, priority: int = 0,
          cancel: threading.Event | None = None) -> list[ScoreOutput]:
    """Cosine similarity of (query, document) pairs, any of them texts or images: 1 query x
    N documents, or N x N pairwise (Engine.score's pairing)."""
    qs, ds = _items(queries), _items(documents)
    pairs = pairing(len(qs), len(ds))
    params = PoolingParams(task="embed", normalize=True)
    q_out = encode(engine, qs, params, truncation, use_tqdm, priority, cancel=cancel,
                   field="queries")
    d_out = encode(engine, ds, params, truncation, use_tqdm, priority, cancel=cancel,
                   field="documents")
    q_vec = np.stack([as_numpy(r.data) for r in q_out])
    d_vec = np.stack([as_numpy(r.data) for r in d_out])
    out, seen = [], set()
    for qi, di in pairs:
        tokens = d_out[di].num_tokens + (q_out[qi].num_tokens if qi not in seen else 0)
        seen.add(qi)
        out.append(ScoreOutput(float(q_vec[qi] @ d_vec[di]), qi, di, tokens))
    return out


def image_side(engine):
    """The input side of an image model: `images` (two-tower: CLIP, SigLIP) or `pages`
    (page retrieval: ColModernVBert, ColPali, ColQwen2); both have `limits` (MediaLimits)
    and `allowed_dir` (local files allowed under it) a server sets. None for text
    models."""
    return engine.images or engine.pages


def cache_stats(engine) -> dict[str, CacheStats] | None:
    """The multimodal input cache's and the encoder cache's counters (None: a text model;
    "encoder" None where transformers runs the vision tower: ColPali, ColQwen2)."""
    side = image_side(engine)
    if side is None:
        return None
    runner = engine.core.model_runner.image_runner  # None: ColPali / ColQwen2 (transformers)
    return {"mm": side.cache.stats(), "encoder": None if runner is None else runner.stats()}


