"""SigLIP and SigLIP2: CLIP's two-tower shape with a sigmoid loss (pooler/models/clip.py has
the shared layers and the contract with the runner).

Differences from CLIP: no class token; the vision tower pools with a multi-head attention
probe (`head`, vision_use_head) after `post_layernorm`; the text tower is bidirectional, runs on
texts padded to 64 tokens (the engine pads; padded keys are masked out as the reference
processor's attention mask does) and pools the last position through `head` (a Linear with
bias). `logit_scale` and `logit_bias` are kept for callers that want SigLIP's logits.

SigLIP2 (NaFlex) embeds flattened patches with a Linear and resizes its square position table
to each image's patch grid (antialiased bilinear, transformers' own weights); images have
different patch counts, so they run packed, each attending only to its own real patches.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from pooler.models.clip import (TextEmbeddings, TowerEncoder, TowerMLP, sub_config)
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_named_weights

_SIGLIP_ACT = "gelu_pytorch_tanh"


class SiglipTextTransformer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.embeddings = TextEmbeddings(cfg)
        self.encoder = TowerEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg["hidden_size"],
                                             eps=cfg.get("layer_norm_eps", 1e-6))
        self.head = nn.Linear(cfg["hidden_size"],
                              int(cfg.get("projection_size") or cfg["hidden_size"]))

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embeddings(inputs.input_ids, inputs.positions)
        x = self.encoder(x, inputs.seq_lens, False, inputs.num_unattended)
        return self.final_layer_norm(x)


class AttentionPoolingHead(nn.Module):
    """A learned probe attends over one image's patches (transformers' names)."""

    def __init__(self, cfg: dict):
        super().__init__()
        hidden = cfg["hidden_size"]
        self.probe = nn.Parameter(torch.zeros(1, 1, hidden))
        self.attention = nn.MultiheadAttention(hidden, cfg["num_attention_heads"],
                                               batch_first=True)
        self.layernorm = nn.LayerNorm(hidden, eps=cfg.get("layer_norm_eps", 1e-6))
        self.mlp = TowerMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", _SIGLIP_ACT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, L, hidden] -> [B, hidden]
        probe = self.probe.expand(x.shape[0], 1, -1)
        x = self.attention(probe, x, x, need_weights=False)[0]
        return (x + self.mlp(self.layernorm(x)))[:, 0]


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        hidden, patch = cfg["hidden_size"], cfg["patch_size"]
        self.patch_embedding = nn.Conv2d(cfg.get("num_channels", 3), hidden, patch, patch)
        self.position_embedding = nn.Embedding((cfg["image_size"] // patch) ** 2, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, 3, H, W]
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [B, patches, hidden]
        if x.shape[1] != self.position_embedding.weight.shape[0]:
            raise ValueError(f"the image has {x.shape[1]} patches, the model's position table "
                             f"{self.position_embedding.weight.shape[0]}: the preprocessor's "
                             "size does not match vision_config.image_size.")
        return x + self.position_embedding.weight


class SiglipVisionTransformer(nn.Module):
    def __init__(self, cfg: dict, with_head: bool = True):
        """with_head=False: patch states only (`patch_states`), for models that read every
        patch (ColModernVBert) and never the pooled output."""
        super().__init__()
        self.embeddings = self._embeddings(cfg)
        self.encoder = TowerEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg["hidden_size"], eps=cfg.get("layer_norm_eps", 1e-6))
        if not with_head:
            return
        if not cfg.get("vision_use_head", True):
            raise ValueError("vision_config.vision_use_head=False leaves SigLIP's vision tower "
                             "without a pooled output; pooler needs the attention-pooling head.")
        self.head = AttentionPoolingHead(cfg)

    @staticmethod
    def _embeddings(cfg: dict) -> nn.Module:
        return SiglipVisionEmbeddings(cfg)

    def patch_states(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, 3, H, W]
        """Every patch's state after post_layernorm: [B, L, hidden] (last_hidden_state)."""
        x = self.embeddings(pixel_values)  # [B, L, hidden]
        batch, length, hidden = x.shape
        x = self.encoder(x.reshape(batch * length, hidden), [length] * batch)
        return self.post_layernorm(x).view(batch, length, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, hidden]
        return self.head(self.patch_states(pixel_values))


class SiglipModel(nn.Module):
    image_input_kind = "siglip"

    def __init__(self, hf_config: dict):
        super().__init__()
        defaults = {"hidden_act": _SIGLIP_ACT, "layer_norm_eps": 1e-6}
        text_cfg = {**defaults, "max_position_embeddings": 64,
                    **sub_config(hf_config, "text_config")}
        vision_cfg = {**defaults, **sub_config(hf_config, "vision_config")}
        self.text_model = SiglipTextTransformer(text_cfg)
        self.vision_model = self._vision(vision_cfg)
        self.logit_scale = nn.Parameter(torch.zeros(1))
        self.logit_bias = nn.Parameter(torch.zeros(1))
        self.embed_dim = self.text_model.head.out_features
        self.patch_size = int(vision_cfg["patch_size"])
        # the reference pads every text to this length ("max_length" padding)
        self.text_length = int(text_cfg["max_position_embeddings"])

    @staticmethod
    def _vision(cfg: dict) -> nn.Module:
        return SiglipVisionTransformer(cfg)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, text hidden]
        return self.text_model(inputs)

    def get_input_embeddings(self) -> nn.Embedding:
        """The text tower's token table (the load-time precision checks time text steps)."""
        return self.text_model.embeddings.token_embedding

    def text_pool_index(self, input_ids: torch.Tensor) -> int:
        return int(input_ids.shape[0]) - 1  # the last (padded) position, as transformers

    def project_text(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.text_model.head(pooled)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, 3, H, W]
        return self.vision_model(pixel_values)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return copy_named_weights(self, weights, type(self).__name__)


# ---- SigLIP2 (NaFlex) -------------------------------------------------------------------
def resized_position_weights(grid: int, rows: int, cols: int) -> torch.Tensor:
    """[rows * cols, grid * grid]: antialiased bilinear weights taking the grid x grid position
    table to a rows x cols one (transformers' Siglip2 resize, one image at a time)."""
    positions = torch.arange(rows * cols, dtype=torch.float32)
    row = torch.div(positions, cols, rounding_mode="floor")
    index = torch.stack([row, positions - row * cols], dim=-1)  # [n, 2]
    sizes = torch.tensor([rows, cols], dtype=torch.float32)
    scale = grid / sizes
    support = scale.clamp(min=1)
    center = (index + 0.5) * scale - 0.5  # [n, 2]
    source = torch.arange(grid, dtype=torch.float32)
    weights = (1 - (source - center[..., None]).abs().div(support[:, None])).clamp(min=0)
    weights = weights / weights.sum(-1, keepdim=True)  # [n, 2, grid]
    return (weights[:, 0, :, None] * weights[:, 1, None, :]).flatten(-2)


class Siglip2VisionEmbeddings(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        hidden, patch = cfg["hidden_size"], cfg["patch_size"]
        self.patch_embedding = nn.Linear(cfg.get("num_channels", 3) * patch * patch, hidden)
        num_patches = int(cfg.get("num_patches", 256))
        self.grid = int(math.isqrt(num_patches))
        self.position_embedding = nn.Embedding(num_patches, hidden)

    def forward(self, patches: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """patches: [n, p*p*3] of one image with a rows x cols grid -> [n, hidden]."""
        x = self.patch_embedding(patches.to(self.patch_embedding.weight.dtype))
        table = self.position_embedding.weight  # [grid*grid, hidden]
        weights = resized_position_weights(self.grid, *shape).to(table.device)
        return x + (weights @ table.float()).to(table.dtype)


class Siglip2VisionTransformer(SiglipVisionTransformer):
    @staticmethod
    def _embeddings(cfg: dict) -> nn.Module:
        return Siglip2VisionEmbeddings(cfg)

    def forward(self, images: list[tuple[torch.Tensor, tuple[int, int]]]) -> torch.Tensor:
        """images: (patches [n_i, p*p*3], (rows, cols)) each -> [B, hidden]."""
        lens = [p.shape[0] for p, _ in images]
        x = torch.cat([self.embeddings(p, s) for p, s in images])  # [sum n_i, hidden]
        x = self.post_layernorm(self.encoder(x, lens))
        pooled, start = [], 0
        for n in lens:  # each image's probe sees only its own patches
            pooled.append(self.head(x[start:start + n].unsqueeze(0)))
            start += n
        return torch.cat(pooled)


class Siglip2Model(SiglipModel):
    image_input_kind = "siglip2"

    @staticmethod
    def _vision(cfg: dict) -> nn.Module:
        return Siglip2VisionTransformer(cfg)

    def image_features(self, images: list[tuple[torch.Tensor, tuple[int, int]]]) -> torch.Tensor:
        return self.vision_model(images)
