"""The ColVision retrieval head (ColModernVBert; ColPali and ColQwen2 have the same one): every
token projected by `embedding_proj_layer` (a Linear with bias), then L2-normalized.

Unlike text ColBERT nothing is dropped: query augmentation tokens, prompt tokens and image
tokens all keep their vector, as the reference keeps every token its attention mask marks
(`ColModernVBertForRetrieval(...).embeddings`). The batching, per-request split and
`dimensions` / `normalize` handling are ColBERTPooler's, with an empty skiplist.
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.pooling.colbert import ColBERTPooler

# transformers' ColModernVBertForRetrieval / ColPaliForRetrieval / ColQwen2ForRetrieval, then
# the original ModernVBERT / colpali-engine name
PROJECTION_PREFIXES = ("embedding_proj_layer.", "custom_text_proj.")


class ColVisionPooler(ColBERTPooler):
    def __init__(self, hidden_size: int, embedding_dim: int):
        super().__init__(nn.Linear(hidden_size, embedding_dim, bias=True), skiplist_ids=(),
                         linear_from_checkpoint=True)

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        for prefix in PROJECTION_PREFIXES:
            state = {n[len(prefix):]: (n, t) for n, t in weights if n.startswith(prefix)}
            if state:
                break
        missing = sorted({"weight", "bias"} - set(state))
        if missing:
            raise ValueError(f"the checkpoint has no {PROJECTION_PREFIXES[0]}{missing[0]} (or "
                             f"{PROJECTION_PREFIXES[1]}{missing[0]}): a ColVision retrieval "
                             "model keeps its projection there.")
        with torch.no_grad():
            for key in ("weight", "bias"):
                name, tensor = state[key]
                param = getattr(self.projector, key)
                if param.shape != tensor.shape:
                    raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}"
                                     f", the head expects {tuple(param.shape)} (embedding_dim "
                                     "in config.json must match the checkpoint).")
                param.copy_(tensor)
        return {state["weight"][0], state["bias"][0]}


def build_colvision_poolers(model_config, backbone: nn.Module) -> dict[str, nn.Module]:
    """token_embed for a ColVision retrieval model (the backbone reports its widths)."""
    return {"token_embed": ColVisionPooler(backbone.hidden_size, backbone.config.embedding_dim)}
