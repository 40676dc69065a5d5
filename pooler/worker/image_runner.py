"""The model runner's image path for two-tower models (CLIP, SigLIP): vision-tower outputs by
image content hash in the encoder cache, shared across requests.

A step's image requests are looked up in the encoder cache (key: model, image content hash and
the preprocessing signature); the misses, each distinct image once, run through the vision
tower in one batch (CLIP/SigLIP: stacked [B, 3, H, W]; SigLIP2: packed patches), and their
projected embeddings are kept. `clear()` is called by the runner's reset_encoder_cache (with
PoolingRunner.clear()) and on weight reload, so nothing computed by old weights is served.
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.multimodal.cache import ByteLRUCache, CacheStats
from pooler.pooling.heads import finalize_embeddings
from pooler.step_contract import NewRequestData

# Default encoder cache: 64 MiB holds ~22k CLIP ViT-B embeddings (512 floats) or ~14k
# SigLIP-so400m ones (1152 floats).
DEFAULT_ENCODER_CACHE_BYTES = 64 * 2**20


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
        keys = [(self.model_key, r.image.content_hash) for r in reqs]
        found: dict = {}
        missing: dict = {}  # key -> a request holding that image (each image computed once)
        for key, req in zip(keys, reqs):
            if key in found or key in missing:
                continue
            cached = self.cache.get(key)
            if cached is None:
                missing[key] = req
            else:
                found[key] = cached
        if missing:
            features = self._image_features([r.image.processed for r in missing.values()])
            for key, row in zip(missing, features):  # row: [embed_dim]
                row = row.clone()
                self.cache.put(key, row, row.numel() * row.element_size())
                found[key] = row
        vectors = torch.stack([found[key] for key in keys])  # [num_reqs, embed_dim]
        return finalize_embeddings(vectors, [r.pooling_params for r in reqs])

    def _image_features(self, images) -> torch.Tensor:  # -> [B, embed_dim]
        dtype = next(self.backbone.parameters()).dtype
        if self.backbone.image_input_kind == "siglip2":
            return self.backbone.image_features(
                [(torch.from_numpy(p.pixel_values).to(self.device, dtype), p.spatial_shape)
                 for p in images])
        pixels = torch.stack([torch.from_numpy(p.pixel_values) for p in images])
        return self.backbone.image_features(pixels.to(self.device, dtype))  # [B, 3, H, W] in
