"""The model runner's image path: vision-tower outputs by image content hash in the encoder
cache, shared across requests. Two shapes (docs/architecture.md):
- two-tower models (CLIP, SigLIP): an image request is the image alone, embedded to one vector
  (`embed`);
- page retrieval (ColModernVBert): a page request is its prompt with `<image>` placeholders;
  the page's tile features (`backbone.image_features(tiles)`, which depends on the pixels only)
  fill those placeholders in the packed batch (`merged_features`), so a page scored against
  many queries runs the vision tower once.

A step's image requests are looked up in the encoder cache (key: model, image content hash and
the preprocessing signature); the misses, each distinct image once, run through the vision
tower in one batch (CLIP/SigLIP: stacked [B, 3, H, W]; SigLIP2: packed patches), and their
projected embeddings are kept. `clear()` is called by the runner's reset_encoder_cache (with
PoolingRunner.clear()) and on weight reload, so nothing computed by old weights is served.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pooler.multimodal.cache import ByteLRUCache, CacheStats
from pooler.pooling.heads import finalize_embeddings
from pooler.step_contract import NewRequestData

# Default encoder cache: 64 MiB holds ~22k CLIP ViT-B embeddings (512 floats) or ~14k
# SigLIP-so400m ones (1152 floats).
DEFAULT_ENCODER_CACHE_BYTES = 64 * 2**20
# Page retrieval keeps a page's features ([tiles * image_seq_len, text hidden]: 3.3 MB for a
# 17-tile ColModernVBert page): 512 MiB holds ~150 such pages.
DEFAULT_PAGE_ENCODER_CACHE_BYTES = 512 * 2**20


class ImageRunner:
    def __init__(self, backbone: nn.Module, model_key: str, device: torch.device,
                 cache_bytes: int = DEFAULT_ENCODER_CACHE_BYTES):
        self.backbone = backbone
        self.model_key = model_key
        self.device = device
        self.cache = ByteLRUCache(cache_bytes)

    def clear(self) -> None:
        self.cache.clear()

    def stats(self) -> CacheStats:
        return self.cache.stats()

    def embed(self, reqs: list[NewRequestData]) -> list[torch.Tensor]:
        """One finished embedding per request (truncation and normalization per its params)."""
        rows = self._cached(reqs, lambda images: [row.clone() for row in
                                                  self._image_features(images)])
        vectors = torch.stack(rows)  # [num_reqs, embed_dim]
        return finalize_embeddings(vectors, [r.pooling_params for r in reqs])

    def _image_features(self, images) -> torch.Tensor:  # -> [B, embed_dim]
        dtype = next(self.backbone.parameters()).dtype
        if self.backbone.image_input_kind == "siglip2":
            return self.backbone.image_features(
                [(torch.from_numpy(p.pixel_values).to(self.device, dtype), p.spatial_shape)
                 for p in images])
        pixels = torch.stack([torch.from_numpy(p.pixel_values) for p in images])
        return self.backbone.image_features(pixels.to(self.device, dtype))  # [B, 3, H, W] in

    def merged_features(self, reqs: list[NewRequestData], starts: list[int],
                        image_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed batch's image rows: reqs are the step's sequences in packed order (each
        starting at row `starts[i]`); those with a merged image get their page's features at
        their placeholder rows. Returns (image_embeds [num_image_tokens, hidden],
        image_positions [num_image_tokens] int64), in row order."""
        pages = [(r, s) for r, s in zip(reqs, starts) if r.image is not None]
        features = self._cached([r for r, _ in pages], self._page_features)
        positions = []
        for (req, start), rows in zip(pages, features):
            ids = torch.tensor(req.prompt_token_ids)
            at = (ids == image_token_id).nonzero().squeeze(-1) + start  # [placeholders]
            if at.shape[0] != rows.shape[0]:
                raise ValueError(f"request {req.req_id} has {at.shape[0]} image placeholders "
                                 f"for {rows.shape[0]} image feature rows.")
            positions.append(at)
        return (torch.cat(features).to(self.device),
                torch.cat(positions).to(self.device))

    def _cached(self, reqs: list[NewRequestData], compute) -> list[torch.Tensor]:
        """One cached tensor per request by image hash; the misses (each image once: a
        duplicate within the step is neither a hit nor a second miss) computed
        together by `compute(list of ProcessedImage) -> list of tensors`."""
        keys = [(self.model_key, r.image.content_hash) for r in reqs]
        found: dict = {}
        missing: dict = {}
        for key, req in zip(keys, reqs):
            if key in found or key in missing:
                continue
            cached = self.cache.get(key)
            if cached is None:
                missing[key] = req
            else:
                found[key] = cached
        if missing:
            for key, value in zip(missing, compute([r.image.processed
                                                    for r in missing.values()])):
                self.cache.put(key, value, value.numel() * value.element_size())
                found[key] = value
        return [found[key] for key in keys]

    def _page_features(self, pages) -> list[torch.Tensor]:
        """Every missing page's tiles in one vision batch, split back per page."""
        dtype = next(self.backbone.parameters()).dtype
        tiles = [p.pixel_values.shape[0] for p in pages]
        pixels = torch.from_numpy(np.concatenate([p.pixel_values for p in pages]))
        rows = self.backbone.image_features(pixels.to(self.device, dtype))  # [tiles*seq, hidden]
        per_tile = rows.shape[0] // sum(tiles)
        return [r.clone() for r in rows.split([n * per_tile for n in tiles])]
