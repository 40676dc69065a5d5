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
from pooler.pooling.heads import finalize_token_embeddings
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

    @property
    def out_features(self) -> int:
        """Length of each token's vector: the projection's output."""
        return self.projector.out_features

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
        lengths = [e - s for s, e in spans]
        if all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)):
            rows: slice | torch.Tensor = slice(spans[0][0], spans[-1][1])  # contiguous: a view
        else:
            rows = torch.cat([torch.arange(s, e) for s, e in spans]).to(hidden.device)
        vectors = self.projector(hidden[rows])  # [num_req_tokens, dim]
        keep = self._keep_mask(metadata, rows, lengths, vectors.device)  # [num_req_tokens]
        params = metadata.pooling_params
        per_request_dims = any(p.dimensions is not None for p in params)
        if not per_request_dims and all(p.normalize for p in params):
            vectors = F.normalize(vectors.float(), p=2, dim=-1).to(vectors.dtype)
        counts = lengths
        if keep is not None:
            vectors = vectors[keep]
            # Kept tokens per request from one cumulative sum (no per-request tensors).
            ends = torch.tensor(lengths, device=keep.device).cumsum(0) - 1
            kept = keep.cumsum(0)[ends]  # [num_reqs] kept tokens up to each request's end
            counts = torch.diff(kept, prepend=kept.new_zeros(1)).tolist()
        out = list(vectors.split(counts))
        if per_request_dims or not all(p.normalize for p in params):
            out = [finalize_token_embeddings(t, p) for t, p in zip(out, params)]
        return out

    def _keep_mask(self, metadata: PoolingMetadata, rows, lengths: list[int],
                   device) -> torch.Tensor | None:
        """Tokens to keep: documents lose skiplist tokens; skip_special_tokens drops specials."""
        params = metadata.pooling_params
        docs = [p.extra.get(ROLE_KEY) == "document" for p in params]
        specials = [p.skip_special_tokens and m is not None
                    for p, m in zip(params, metadata.special_tokens_masks)]
        if not ((any(docs) and self.skiplist.numel() and metadata.input_ids is not None)
                or any(specials)):
            return None
        keep = torch.ones(sum(lengths), dtype=torch.bool, device=device)
        if any(docs) and self.skiplist.numel() and metadata.input_ids is not None:
            is_doc = torch.repeat_interleave(torch.tensor(docs, device=device),
                                             torch.tensor(lengths, device=device))
            keep &= ~(is_doc & torch.isin(metadata.input_ids[rows], self.skiplist))
        offset = 0
        for n, special, mask in zip(lengths, specials, metadata.special_tokens_masks):
            if special:
                keep[offset:offset + n] &= torch.tensor([not s for s in mask], device=device)
            offset += n
        return keep



def build_colbert_poolers(model_config, backbone: nn.Module) -> dict[str, nn.Module]:
    """token_embed for a ColBERT model (PyLate Dense folders, or the checkpoint's linear)."""
    from pooler.colbert import ColBERTTokens
    from pooler.tokenizer import TextTokenizer
    from pooler.pooling.heads import DenseProjector

    config = model_config.colbert
    st = model_config.st
    tokenizer = TextTokenizer(model_config.path, model_config.tokenizer_config)
    tokens = ColBERTTokens.resolve(config, tokenizer)
    if config.layout in ("pylate", "sentence-transformers"):  # Dense folders
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
    """Output size of the checkpoint's projection, read from the file header when possible."""
    from safetensors import safe_open

    from pooler.checkpoint import checkpoint_files, iterate_weights

    files = checkpoint_files(model_config.path)
    if all(f.suffix == ".safetensors" for f in files):
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in LINEAR_WEIGHT_NAMES:
                    if name in f.keys():
                        return int(f.get_slice(name).get_shape()[0])
    else:
        for name, tensor in iterate_weights(model_config.path):
            if name in LINEAR_WEIGHT_NAMES:
                return int(tensor.shape[0])
    raise ValueError(f"{model_config.path}: ColBERT checkpoint has no projection weight; "
                     f"expected one of {list(LINEAR_WEIGHT_NAMES)}.")
