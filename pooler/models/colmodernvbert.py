"""ColModernVBert (transformers' ColModernVBertForRetrieval): late interaction over page images
with a SigLIP vision tower and a ModernBERT text encoder.

A page image is cut into tiles (pooler/multimodal/idefics3_processing.py). Each tile runs
through SigLIP's vision tower (pooler/models/siglip.py, without its pooling head); the connector
pixel-shuffles every `f x f` block of patch states into one vector and projects it to the text
width, so a tile becomes `image_seq_len = (image_size / patch_size)**2 / f**2` vectors. Those
vectors replace, in order, the `<image>` placeholder tokens of the document prompt's token
embeddings, and ModernBERT (pooler/models/modernbert.py) runs over the merged sequence: its
embedding norm comes after the merge, as transformers does. The retrieval head (a Linear with
bias to `embedding_dim`, then L2 normalization over every token) is
pooler/pooling/colvision.py; this file returns hidden states and never pools.

Contract with the runner (tensor in, hidden states out):
- `image_features(pixel_values)`: pixel_values [num_tiles, 3, S, S] (the tiles of one or more
  images, each image's tiles row-major then its global image, S = `tile_side`) ->
  [num_tiles * image_seq_len, text hidden]. Depends on the pixels only: this is what the
  encoder cache keeps per image content hash (one image's rows are its tiles' rows, in order).
- `forward(inputs, image_embeds=None, image_positions=None)`: inputs is pooler's packed text
  batch (queries and document prompts together, pooler/models/inputs.py); image_embeds
  [num_image_tokens, text hidden] are the image features of every document of the step,
  concatenated in the order their placeholders appear in `inputs.input_ids`; image_positions
  [num_image_tokens] int64 are those placeholder rows (default: every row whose id is
  `image_token_id`). Returns [num_tokens, text hidden] after ModernBERT's final norm.

Checkpoint names: transformers saves `vlm.vision_model.*`, `vlm.connector.*`, `vlm.text_model.*`
(this module's names once `vlm.` is stripped) and `embedding_proj_layer.*` (the pooler's);
`vlm.vision_model.head.*` (SigLIP's pooling head, unused by the model) is left unread. The
original ModernVBERT layout (as vLLM reads it: `model.` prefix, `connector.modality_projection.
proj`, the token embeddings split into the base table and `additional_embedding` rows, the head
as `custom_text_proj`, vision_config's width as `embed_dim`, vlm_config's
`additional_vocab_size`) is read as the same model; it was built from vLLM's loader, not checked
against the hub's files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from pooler.models.inputs import ModelInputs
from pooler.models.modernbert import ModernBertModel
from pooler.models.siglip import SiglipVisionTransformer
from pooler.models.weights import copy_named_weights

# transformers' defaults for keys a saved config may leave out.
_SIGLIP_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072,
                           "num_hidden_layers": 12, "num_attention_heads": 12,
                           "num_channels": 3, "image_size": 224, "patch_size": 16,
                           "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
_MODERNBERT_DEFAULTS = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
                        "num_hidden_layers": 22, "num_attention_heads": 12}


@dataclass(frozen=True)
class ColModernVBertConfig:
    text: dict            # ModernBERT's config (vlm_config.text_config)
    vision: dict          # SigLIP vision tower's config (vlm_config.vision_config)
    image_token_id: int
    pixel_shuffle_factor: int
    embedding_dim: int

    @property
    def tile_side(self) -> int:
        """The side of one tile the vision tower takes (no position interpolation)."""
        return int(self.vision["image_size"])

    @property
    def patch_size(self) -> int:
        return int(self.vision["patch_size"])

    @property
    def image_seq_len(self) -> int:
        """Vectors (and `<image>` placeholders) per tile."""
        return (self.tile_side // self.patch_size) ** 2 // self.pixel_shuffle_factor ** 2

    @classmethod
    def from_dict(cls, hf_config: dict) -> "ColModernVBertConfig":
        vlm = hf_config.get("vlm_config")
        if not isinstance(vlm, dict):
            raise ValueError("config.json has no vlm_config: ColModernVBertForRetrieval folders "
                             "are saved by transformers >= 5 (ColModernVBertConfig); re-save an "
                             "older layout with ColModernVBertForRetrieval.save_pretrained.")
        text = {**_MODERNBERT_DEFAULTS, **(vlm.get("text_config") or {})}
        vision = {**_SIGLIP_VISION_DEFAULTS, **(vlm.get("vision_config") or {})}
        # the original layout: DecoupledEmbedding's extra rows (image tokens) after the base
        # vocabulary, and the vision width under SigLIP's older name
        text["vocab_size"] = int(text["vocab_size"]) + int(vlm.get("additional_vocab_size", 0))
        if "embed_dim" in (vlm.get("vision_config") or {}) and \
                "hidden_size" not in vlm["vision_config"]:
            vision["hidden_size"] = vision["embed_dim"]
        factor = int(vlm.get("pixel_shuffle_factor", 4))
        image_size, patch = int(vision["image_size"]), int(vision["patch_size"])
        grid = image_size // patch
        if image_size % patch or factor <= 0 or grid % factor:
            raise ValueError(f"vision_config image_size {image_size} / patch_size {patch} must be "
                             f"a whole grid divisible by pixel_shuffle_factor {factor}.")
        return cls(text=text, vision=vision, image_token_id=int(vlm.get("image_token_id", 50407)),
                   pixel_shuffle_factor=factor,
                   embedding_dim=int(hf_config.get("embedding_dim", 128)))


def pixel_shuffle(patches: torch.Tensor, factor: int) -> torch.Tensor:
    """[tiles, side*side, dim] -> [tiles, side*side / f**2, dim * f**2]: every f x f block of
    neighbouring patches becomes one vector (transformers' ModernVBertConnector.pixel_shuffle)."""
    tiles, length, dim = patches.shape
    side = math.isqrt(length)
    x = patches.reshape(tiles, side, side // factor, dim * factor)  # f neighbours in a row
    x = x.permute(0, 2, 1, 3).reshape(tiles, side // factor, side // factor, dim * factor ** 2)
    return x.permute(0, 2, 1, 3).reshape(tiles, length // factor ** 2, dim * factor ** 2)


class ModernVBertConnector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, factor: int):
        super().__init__()
        self.factor = factor
        self.modality_projection = nn.Linear(vision_hidden * factor ** 2, text_hidden, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        # [tiles, patches, vision hidden] -> [tiles, image_seq_len, text hidden]
        return self.modality_projection(pixel_shuffle(patches, self.factor))


class ColModernVBertModel(nn.Module):
    weight_prefixes = ("vlm.", "model.")  # transformers' layout, the original one
    image_input_kind = "idefics3"

    def __init__(self, hf_config: dict):
        super().__init__()
        cfg = self.config = ColModernVBertConfig.from_dict(hf_config)
        self.vision_model = SiglipVisionTransformer(cfg.vision, with_head=False)
        self.connector = ModernVBertConnector(int(cfg.vision["hidden_size"]),
                                              int(cfg.text["hidden_size"]),
                                              cfg.pixel_shuffle_factor)
        self.text_model = ModernBertModel(cfg.text)

    @property
    def hidden_size(self) -> int:
        return self.text_model.hidden_size

    @property
    def image_token_id(self) -> int:
        return self.config.image_token_id

    @property
    def image_seq_len(self) -> int:
        return self.config.image_seq_len

    @property
    def tile_side(self) -> int:
        return self.config.tile_side

    @property
    def vision_tokens_per_tile(self) -> int:
        """Sequence length of one tile in the vision tower (what a step budget charges)."""
        return (self.config.tile_side // self.config.patch_size) ** 2

    def get_input_embeddings(self) -> nn.Embedding:
        return self.text_model.get_input_embeddings()

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[num_tiles, 3, S, S] -> [num_tiles * image_seq_len, text hidden]."""
        if pixel_values.dim() != 4 or pixel_values.shape[-2:] != (self.tile_side,) * 2:
            raise ValueError(f"pixel_values must be [num_tiles, 3, {self.tile_side}, "
                             f"{self.tile_side}] tiles, got {tuple(pixel_values.shape)}: the "
                             "preprocessor's max_image_size must equal vision_config.image_size.")
        patches = self.vision_model.patch_states(pixel_values)  # [tiles, patches, vision hidden]
        features = self.connector(patches)  # [tiles, image_seq_len, text hidden]
        return features.reshape(-1, features.shape[-1])

    def forward(self, inputs: ModelInputs, image_embeds: torch.Tensor | None = None,
                image_positions: torch.Tensor | None = None) -> torch.Tensor:
        """-> [num_tokens, text hidden]; see the module docstring for the image arguments."""
        if image_embeds is None:
            return self.text_model(inputs)
        embeds = self.get_input_embeddings()(inputs.input_ids)  # [num_tokens, hidden]
        if image_positions is None:
            image_positions = (inputs.input_ids == self.image_token_id).nonzero().squeeze(-1)
        if image_positions.shape[0] != image_embeds.shape[0]:
            raise ValueError(f"the batch has {image_positions.shape[0]} image placeholder tokens "
                             f"but {image_embeds.shape[0]} image feature rows: each page's "
                             f"prompt needs image_seq_len ({self.image_seq_len}) <image> tokens "
                             "per tile (expand it with the same preprocessing as its pixels).")
        embeds = embeds.index_copy(0, image_positions, image_embeds.to(embeds.dtype))
        return self.text_model(inputs, inputs_embeds=embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint names with `vlm.` (or `model.`) stripped equal ours, up to the original
        layout's renames; returns the checkpoint names consumed."""
        ours, sources = [], {}
        base = extra = None
        for name, tensor in weights:
            if name == _TOKEN_TABLE:
                base = (name, tensor)
                continue
            if name == _EXTRA_TOKEN_ROWS:
                extra = (name, tensor)
                continue
            target = _ORIGINAL_RENAMES.get(name, name)
            ours.append((target, tensor))
            sources[target] = [name]
        if base is not None:
            table = base[1] if extra is None else torch.cat([base[1], extra[1]])
            ours.append((_TOKEN_TABLE, table))  # [vocab (+ additional), hidden]
            sources[_TOKEN_TABLE] = [base[0]] + ([extra[0]] if extra is not None else [])
        consumed = copy_named_weights(self, ours, "ColModernVBert")
        return {source for name in consumed for source in sources[name]}


_TOKEN_TABLE = "text_model.embeddings.tok_embeddings.weight"
_EXTRA_TOKEN_ROWS = "text_model.embeddings.tok_embeddings.additional_embedding.weight"
_ORIGINAL_RENAMES = {"connector.modality_projection.proj.weight":
                     "connector.modality_projection.weight"}
