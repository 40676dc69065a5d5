"""Queries, page images and text documents of page-retrieval models (ColModernVBert) as the
engine submits them (the calls pooler/multimodal/colmodernvbert_inputs.py lists, in order).

- A query: `prompts.query_text(query)` (prefix + query + augmentation tokens), tokenized with
  special tokens; a text request.
- A page image: decoded and hashed (pooler/multimodal/media.py), then its prompt ids and tiles
  built once per content hash (the multimodal input cache, `PageInputs.cache`, cleared by
  `Engine.reset_mm_cache`). The request's tokens are the prompt with one `<image>` per image
  vector; its image (merged into the prompt by the runner, pooler/worker/image_runner.py) is
  charged `len(input_ids) + num_tiles * vision_tokens_per_tile` against the step's budget.
- A text document: the text tokenized as it is (transformers' processor on text alone).

ColPali and ColQwen2 (`ProcessorPageInputs`): transformers' own processor makes a query's ids
(`process_queries`) and a page's ids and tensors (`process_images`), kept in the mm cache the
same way; the runner is pooler/worker/colvision_runner.py.

Nothing is truncated: a query, text or page longer than max_model_len is refused naming the
item (a cut page would lose image placeholders, a cut query its augmentation tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pooler.engine.input_processor import ProcessedInput
from pooler.multimodal.cache import ByteLRUCache
from pooler.multimodal.colmodernvbert_inputs import ColModernVBertPrompts, build_document_inputs
from pooler.multimodal.image_processing import ProcessedImage
from pooler.multimodal.inputs import ImageRequestData
from pooler.multimodal.media import DEFAULT_LIMITS, MediaLimits, is_image_item, load_image

# Default multimodal input cache for pages: 512 MiB holds ~9 of the largest ColModernVBert pages
# (17 tiles of 3 x 512 x 512 float32: 53 MB each) or ~100 single-tile ones.
DEFAULT_PAGE_MM_CACHE_BYTES = 512 * 2**20


class PageInputs:
    """An engine's page side: the tokenizer, the mm cache, the limits; what a query and a page
    become is the model kind's (ColModernVBertPageInputs, ProcessorPageInputs)."""

    def __init__(self, model_config, tokenizer, max_num_batched_tokens: int,
                 cache_bytes: int = DEFAULT_PAGE_MM_CACHE_BYTES,
                 limits: MediaLimits = DEFAULT_LIMITS, allowed_dir: str | None = None):
        self.tokenizer = tokenizer
        self.max_model_len = model_config.max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.architecture = model_config.architecture
        self.cache = ByteLRUCache(cache_bytes)
        self.limits = limits
        self.allowed_dir = allowed_dir  # a server sets it; the offline API reads any path

    @classmethod
    def for_engine(cls, engine) -> "PageInputs | None":
        """The engine's page side (None unless a page-retrieval model), its cache registered
        with the model runner so that reset_mm_cache and reload_weights reach it."""
        layout = getattr(engine.model_config, "pages", None)
        if layout is None:
            return None
        runner = engine.core.model_runner
        budget = engine.config.scheduler_config.max_num_batched_tokens
        if layout.runner == "transformers":
            inputs: PageInputs = ProcessorPageInputs(engine.model_config, engine.tokenizer,
                                                     budget, runner.encoder.processor)
        else:
            inputs = ColModernVBertPageInputs(engine.model_config, engine.tokenizer, budget,
                                              runner.model.backbone)
        runner.mm_cache = inputs.cache
        return inputs

    # ---- one item ---------------------------------------------------------------------
    def query(self, text: Any, index: int, field: str = "queries") -> ProcessedInput:
        raise NotImplementedError

    def page(self, item: Any, index: int, field: str = "documents") -> ProcessedInput:
        raise NotImplementedError

    def _check_query(self, text: Any, index: int, field: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"{field}[{index}] must be a text: {self.architecture} queries are "
                             "texts (pages are the documents).")

    def document(self, item: Any, index: int, field: str = "documents") -> ProcessedInput:
        """A page image (PIL image, pathlib.Path, bytes, data URL, {"image": ...}) or a text."""
        if is_image_item(item):
            return self.page(item, index, field)
        if isinstance(item, dict) and "prompt" in item:
            item = item["prompt"]
        if not isinstance(item, str):
            raise ValueError(f"{field}[{index}] must be a page image or a text, got "
                             f"{type(item).__name__}.")
        return self._text(item, index, field)

    def _check_page(self, ids: list[int], cost: int, placeholders: str, vision: str,
                    index: int, field: str) -> None:
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"{field}[{index}]: the page's prompt is {len(ids)} tokens ({placeholders}), "
                f"more than max_model_len="
                f"{self.max_model_len}; pages are never truncated (a cut page loses image "
                "tokens): raise max_model_len or lower the processor's size.longest_edge.")
        if cost > self.max_num_batched_tokens:
            raise ValueError(
                f"{field}[{index}]: the page costs {cost} tokens ({len(ids)} prompt tokens + "
                f"{vision}), more than max_num_batched_tokens={self.max_num_batched_tokens}: "
                "raise it (--max-num-batched-tokens).")

    def _text(self, text: str, index: int, field: str) -> ProcessedInput:
        encoded = self.tokenizer.encode_batch([text])[0]
        ids = list(encoded.input_ids)
        if len(ids) > self.max_model_len:
            raise ValueError(f"{field}[{index}] is {len(ids)} tokens, more than max_model_len="
                             f"{self.max_model_len}; shorten it ({self.architecture} inputs are "
                             "not truncated).")
        return ProcessedInput(prompt_token_ids=ids,
                              special_tokens_mask=encoded.special_tokens_mask)

    # ---- many -------------------------------------------------------------------------
    def build(self, items: list, role: str, field: str | None = None) -> list[ProcessedInput]:
        """role "query" (texts, with the query prompt) or "document" (pages or texts)."""
        make = self.query if role == "query" else self.document
        field = field or ("queries" if role == "query" else "documents")
        return [make(item, i, field) for i, item in enumerate(items)]


class ColModernVBertPageInputs(PageInputs):
    """ColModernVBert: the query prompt and pages split into tiles by pooler's processor
    (pooler/multimodal/colmodernvbert_inputs.py), checked against the model once."""

    def __init__(self, model_config, tokenizer, max_num_batched_tokens: int, backbone,
                 **kwargs):
        super().__init__(model_config, tokenizer, max_num_batched_tokens, **kwargs)
        self.prompts = ColModernVBertPrompts.from_folder(model_config.path)
        self.prompts.check_tokenizer(tokenizer, backbone.image_token_id)
        self.prompts.check_model(backbone.tile_side, backbone.image_seq_len)
        self.vision_tokens_per_tile = backbone.vision_tokens_per_tile

    def query(self, text: Any, index: int, field: str = "queries") -> ProcessedInput:
        self._check_query(text, index, field)
        return self._text(self.prompts.query_text(text), index, field)

    def page(self, item: Any, index: int, field: str = "documents") -> ProcessedInput:
        decoded = load_image(item, index, limits=self.limits, allowed_dir=self.allowed_dir,
                             field=field)
        document = self.cache.get(decoded.content_hash)
        if document is None:
            document = build_document_inputs(decoded.image, self.prompts, self.tokenizer)
            self.cache.put(decoded.content_hash, document, document.pixel_values.nbytes)
        ids = list(document.input_ids)
        cost = len(ids) + document.num_tiles * self.vision_tokens_per_tile
        self._check_page(ids, cost, f"{document.num_tiles} tiles of "
                         f"{self.prompts.image_seq_len} image tokens",
                         f"{document.num_tiles} tiles x {self.vision_tokens_per_tile} vision "
                         "tokens", index, field)
        return ProcessedInput(prompt_token_ids=ids, extra={"image": ImageRequestData(
            decoded.content_hash, ProcessedImage(document.pixel_values), cost, merged=True)})


@dataclass(frozen=True)
class ProcessorPage:
    """One page as transformers' processor made it, for ColPali / ColQwen2's forward."""
    input_ids: list[int]
    tensors: dict[str, np.ndarray]  # pixel_values (ColPali [1, 3, H, W]; ColQwen2 [patches,
    #                                 d]), token_type_ids, image_grid_thw: the model's inputs
    num_vision_tokens: int          # what the vision tower runs

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.tensors.values()))


class ProcessorPageInputs(PageInputs):
    """ColPali / ColQwen2: queries and pages through transformers' processor."""

    def __init__(self, model_config, tokenizer, max_num_batched_tokens: int, processor,
                 **kwargs):
        super().__init__(model_config, tokenizer, max_num_batched_tokens, **kwargs)
        self.processor = processor

    def query(self, text: Any, index: int, field: str = "queries") -> ProcessedInput:
        self._check_query(text, index, field)
        batch = self.processor.process_queries([text])
        ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
        if len(ids) > self.max_model_len:
            raise ValueError(f"{field}[{index}] is {len(ids)} tokens, more than max_model_len="
                             f"{self.max_model_len}; shorten it.")
        return ProcessedInput(prompt_token_ids=ids)

    def page(self, item: Any, index: int, field: str = "documents") -> ProcessedInput:
        decoded = load_image(item, index, limits=self.limits, allowed_dir=self.allowed_dir,
                             field=field)
        page = self.cache.get(decoded.content_hash)
        if page is None:
            page = self._process(decoded.image)
            self.cache.put(decoded.content_hash, page, page.nbytes)
        cost = len(page.input_ids) + page.num_vision_tokens
        self._check_page(page.input_ids, cost, "with its image tokens",
                         f"{page.num_vision_tokens} vision tokens", index, field)
        return ProcessedInput(prompt_token_ids=list(page.input_ids), extra={
            "image": ImageRequestData(decoded.content_hash, page, cost, merged=True)})

    def _process(self, image) -> ProcessorPage:
        batch = self.processor.process_images([image])
        mask = batch["attention_mask"][0].bool()
        tensors = {"pixel_values": batch["pixel_values"].numpy()}
        if "image_grid_thw" in batch:  # ColQwen2: patches [1, t*h*w, d] and their grid
            tensors["image_grid_thw"] = batch["image_grid_thw"].numpy()
            vision = int(batch["image_grid_thw"].prod(dim=-1).sum())
        else:  # ColPali: one fixed-size image
            vision = int(batch["input_ids"].eq(self.processor.image_token_id).sum())
        if "token_type_ids" in batch:
            tensors["token_type_ids"] = batch["token_type_ids"][:, mask].numpy()
        return ProcessorPage(batch["input_ids"][0][mask].tolist(), tensors, vision)
