"""The ColBERT head: every token projected, punctuation dropped from documents, L2-normalized.

Works on the whole packed batch at once (one projection, one mask, one normalization), then
splits per request. A request's role ("query" / "document") comes from its params.extra; a
request without one (plain token_embed) keeps every token.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.colbert import LINEAR_WEIGHT_NAMES, ROLE_KEY
from pooler.pooling.metadata import PoolingMetadata


class ColBERTPooler(nn.Module):
    task = "token_embed"

    def __init__(self, projector: nn.Module, skiplist_ids: Iterable[int],
                 linear_from_checkpoint: bool):
        super().__init__()
        self.projector = projector
        self.register_buffer("skiplist", torch.tensor(sorted(skiplist_ids), dtype=torch.long),
                             persistent=False)
        self.linear_from_checkpoint = linear_from_checkpoint

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        """Stanford / plain layouts keep the projection in the main checkpoint."""
        if not self.linear_from_checkpoint:
            return set()
        for name, tensor in weights:
            if name in LINEAR_WEIGHT_NAMES:
                with torch.no_grad():
                    self.projector.weight.copy_(tensor)
                return {name}
        raise ValueError(f"ColBERT checkpoint has no projection weight; expected one of "
                         f"{list(LINEAR_WEIGHT_NAMES)}.")

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        spans = metadata.token_spans()
        rows = torch.cat([torch.arange(s, e) for s, e in spans]).to(hidden.device)
        vectors = self.projector(hidden[rows])  # [num_req_tokens, dim]
        ids = metadata.input_ids[rows] if metadata.input_ids is not None else None
        out, offset = [], 0
        for (start, end), params, special in zip(spans, metadata.pooling_params,
                                                 metadata.special_tokens_masks):
            tokens = vectors[offset:offset + end - start]  # [seq_len, dim]
            keep = None
            if params.extra.get(ROLE_KEY) == "document" and ids is not None \
                    and self.skiplist.numel():
                keep = ~torch.isin(ids[offset:offset + end - start], self.skiplist)
            if params.skip_special_tokens and special is not None:
                not_special = torch.tensor([not s for s in special], device=tokens.device)
                keep = not_special if keep is None else keep & not_special
            offset += end - start
            if keep is not None:
                tokens = tokens[keep]
            if params.dimensions is not None:
                if params.dimensions > tokens.shape[-1]:
                    raise ValueError(f"dimensions={params.dimensions} is larger than the "
                                     f"model's token embedding size {tokens.shape[-1]}.")
                tokens = tokens[:, : params.dimensions]
            if params.normalize:
                tokens = F.normalize(tokens.float(), p=2, dim=-1).to(tokens.dtype)
            out.append(tokens)
        return out


def build_colbert_poolers(model_config, backbone: nn.Module) -> dict[str, nn.Module]:
    """token_embed for a ColBERT model (PyLate Dense folders, or the checkpoint's linear)."""
    from pooler.colbert import ColBERTTokens
    from pooler.engine.tokenizer import TextTokenizer
    from pooler.pooling.heads import DenseProjector

    config = model_config.colbert
    st = model_config.st
    tokenizer = TextTokenizer(model_config.path, model_config.tokenizer_config)
    tokens = ColBERTTokens.resolve(config, tokenizer)
    if config.layout == "pylate":
        projector: nn.Module = DenseProjector(st.dense)
        from_checkpoint = False
    else:
        dim = model_config.hf_config.get("colbert_dim") or model_config.hf_config.get("dim")
        if dim is None:  # Stanford checkpoints do not record it in config.json: read it
            dim = _linear_out_features(model_config)
        projector = nn.Linear(model_config.hidden_size, int(dim), bias=False)
        from_checkpoint = True
    return {"token_embed": ColBERTPooler(projector, tokens.skiplist_ids, from_checkpoint)}


def _linear_out_features(model_config) -> int:
    from pooler.loader import iterate_weights

    for name, tensor in iterate_weights(model_config.path):
        if name in LINEAR_WEIGHT_NAMES:
            return int(tensor.shape[0])
    raise ValueError(f"{model_config.path}: ColBERT checkpoint has no projection weight; "
                     f"expected one of {list(LINEAR_WEIGHT_NAMES)}.")
