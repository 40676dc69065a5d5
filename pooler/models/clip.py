"""CLIP: a text tower and a vision tower whose projections land in one embedding space.

Module names mirror transformers' CLIPModel, so its checkpoint loads by name. The text tower
runs on pooler's packed batches (causal attention, as CLIP's text model) and returns hidden
states [num_tokens, hidden] after the final layer norm; the two-tower pooler
(pooler/pooling/two_tower.py) picks each text's EOS state and applies `project_text`. The
vision tower takes a dense [images, 3, H, W] batch (every image has the same patch count) and
returns projected image features [images, projection_dim] (`image_features`): what
transformers' `get_image_features(...).pooler_output` returns.

`logit_scale` is kept for callers that want CLIP's logits; pooler's `score` gives raw cosine
similarity, as sentence-transformers' CLIP does.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from pooler.layers.activations import get_activation
from pooler.layers.attention import packed_attention
from pooler.layers.linear import linear_act, linear_add, onednn_postop
from pooler.models.inputs import ModelInputs
from pooler.models.weights import copy_named_weights


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return x * torch.sigmoid(1.702 * x)
    # inference: one [tokens, intermediate] buffer instead of three (sigmoid and the product
    # in place), the same values
    return torch.mul(x, 1.702).sigmoid_().mul_(x)


def tower_activation(name: str):
    return quick_gelu if name == "quick_gelu" else get_activation(name)


class TowerAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.num_heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, seq_lens: list[int], cu_seqlens: torch.Tensor,
                causal: bool, num_unattended: list[int] | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """out_proj(attention(x)) [num_tokens, hidden], plus `residual` when given (added in
        the GEMM's epilogue on the CPU fast path, pooler/layers/linear.py)."""
        shape = (x.shape[0], self.num_heads, self.head_dim)
        # linear_act: oneDNN's GEMM with the bias in its epilogue on the CPU fp32 path (torch's
        # addmm first copies the bias into the output: ~20% of a ViT-B forward on 2 threads)
        out = packed_attention(linear_act(self.q_proj, x).view(shape),
                               linear_act(self.k_proj, x).view(shape),
                               linear_act(self.v_proj, x).view(shape), seq_lens, cu_seqlens,
                               max(seq_lens), causal=causal, num_unattended=num_unattended)
        out = out.reshape(x.shape)
        if residual is None:
            return linear_act(self.out_proj, out)
        return linear_add(self.out_proj, out, residual)


class TowerMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str):
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)
        self.act = tower_activation(act)
        self.postop = onednn_postop(act)  # None for quick_gelu: applied after the GEMM

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """fc2(act(fc1(x))), plus `residual` when given; on the CPU fp32 path both GEMMs
        run on oneDNN with the bias (fc1: and GELU; fc2: and the residual add) fused."""
        if self.postop is not None:
            h = linear_act(self.fc1, x, self.act, self.postop)
        else:
            h = self.act(linear_act(self.fc1, x))
        if residual is None:
            return linear_act(self.fc2, h)
        return linear_add(self.fc2, h, residual)


class TowerLayer(nn.Module):
    """Pre-norm transformer layer shared by CLIP's and SigLIP's towers."""

    def __init__(self, cfg: dict):
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-5)
        self.layer_norm1 = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = TowerAttention(hidden, cfg["num_attention_heads"])
        self.layer_norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = TowerMLP(hidden, cfg["intermediate_size"], cfg.get("hidden_act", "quick_gelu"))

    def forward(self, x, seq_lens, cu_seqlens, causal, num_unattended=None):
        x = self.self_attn(self.layer_norm1(x), seq_lens, cu_seqlens, causal, num_unattended,
                           residual=x)
        return self.mlp(self.layer_norm2(x), residual=x)


class TowerEncoder(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.layers = nn.ModuleList(TowerLayer(cfg) for _ in range(cfg["num_hidden_layers"]))

    def forward(self, x, seq_lens, causal=False, num_unattended=None):
        bounds = [0]
        for n in seq_lens:
            bounds.append(bounds[-1] + n)
        cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=x.device)
        for layer in self.layers:
            x = layer(x, seq_lens, cu_seqlens, causal, num_unattended)
        return x


def cu_to_lens(cu_seqlens: torch.Tensor) -> list[int]:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


class TextEmbeddings(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.token_embedding = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.position_embedding = nn.Embedding(cfg["max_position_embeddings"], cfg["hidden_size"])

    def forward(self, input_ids, positions):
        return self.token_embedding(input_ids) + self.position_embedding(positions)


class CLIPTextTransformer(nn.Module):
    causal = True

    def __init__(self, cfg: dict):
        super().__init__()
        self.embeddings = TextEmbeddings(cfg)
        self.encoder = TowerEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg["hidden_size"],
                                             eps=cfg.get("layer_norm_eps", 1e-5))

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        x = self.embeddings(inputs.input_ids, inputs.positions)
        x = self.encoder(x, inputs.seq_lens, self.causal, inputs.num_unattended)
        return self.final_layer_norm(x)


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        hidden, patch = cfg["hidden_size"], cfg["patch_size"]
        self.class_embedding = nn.Parameter(torch.zeros(hidden))
        self.patch_embedding = nn.Conv2d(cfg.get("num_channels", 3), hidden, patch, patch,
                                         bias=False)
        num_positions = (cfg["image_size"] // patch) ** 2 + 1
        self.position_embedding = nn.Embedding(num_positions, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        patches = patches.flatten(2).transpose(1, 2)  # [B, patches, hidden]
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1)  # [B, patches + 1, hidden]
        if x.shape[1] != self.position_embedding.weight.shape[0]:
            raise ValueError(f"the image has {x.shape[1] - 1} patches, the model's position "
                             f"table {self.position_embedding.weight.shape[0] - 1}: the "
                             "preprocessor's crop size does not match vision_config.image_size.")
        return x + self.position_embedding.weight


class CLIPVisionTransformer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        eps = cfg.get("layer_norm_eps", 1e-5)
        self.embeddings = CLIPVisionEmbeddings(cfg)
        self.pre_layrnorm = nn.LayerNorm(cfg["hidden_size"], eps=eps)  # (sic) transformers' name
        self.encoder = TowerEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg["hidden_size"], eps=eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # [B, hidden] pooled
        x = self.pre_layrnorm(self.embeddings(pixel_values))  # [B, L, hidden]
        batch, length, hidden = x.shape
        x = self.encoder(x.reshape(batch * length, hidden), [length] * batch)
        return self.post_layernorm(x.view(batch, length, hidden)[:, 0])


def sub_config(hf_config: dict, name: str) -> dict:
    cfg = dict(hf_config.get(name) or {})
    if not cfg:
        raise ValueError(f"config.json has no {name}; is this a two-tower image-text model?")
    return cfg


class CLIPModel(nn.Module):
    """Both towers and their projections (transformers' CLIPModel)."""
    image_input_kind = "clip"

    def __init__(self, hf_config: dict):
        super().__init__()
        text_cfg = {"hidden_act": "quick_gelu", "max_position_embeddings": 77,
                    **sub_config(hf_config, "text_config")}
        vision_cfg = {"hidden_act": "quick_gelu", **sub_config(hf_config, "vision_config")}
        projection = int(hf_config.get("projection_dim", 512))
        self.text_model = CLIPTextTransformer(text_cfg)
        self.vision_model = CLIPVisionTransformer(vision_cfg)
        self.text_projection = nn.Linear(text_cfg["hidden_size"], projection, bias=False)
        self.visual_projection = nn.Linear(vision_cfg["hidden_size"], projection, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))
        self.embed_dim = projection
        self.patch_size = int(vision_cfg["patch_size"])
        # transformers' rule: a config saved before its fix (eos_token_id 2) pools at the
        # highest token id, newer ones at the first EOS.
        self.eos_token_id = int(text_cfg.get("eos_token_id", 2))

    # ---- text ---------------------------------------------------------------------------
    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, text hidden]
        return self.text_model(inputs)

    def get_input_embeddings(self) -> nn.Embedding:
        """The text tower's token table (the load-time precision checks time text steps)."""
        return self.text_model.embeddings.token_embedding

    def text_pool_index(self, input_ids: torch.Tensor) -> int:
        """Which token of one text ([seq_len] ids) carries its embedding."""
        if self.eos_token_id == 2:
            return int(input_ids.to(torch.int).argmax())
        return int((input_ids == self.eos_token_id).to(torch.int).argmax())

    def project_text(self, pooled: torch.Tensor) -> torch.Tensor:  # [R, hidden] -> [R, P]
        return self.text_projection(pooled)

    # ---- images -------------------------------------------------------------------------
    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, projection_dim]."""
        return self.visual_projection(self.vision_model(pixel_values))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return copy_named_weights(self, weights, type(self).__name__)
