"""ColBERT query expansion with unattended [MASK] tokens, around a packed BERT backbone.

PyLate and Stanford ColBERT pad queries with [MASK] tokens whose attention mask is 0 (unless
`attend_to_expansion_tokens`): those tokens are computed and used in MaxSim, but no token
attends to them. The packed attention has no key mask, so this wrapper sends sequences with
unattended tokens (`ModelInputs.num_unattended`, host list) through a padded, key-masked pass
over the same weights, and every other sequence through the backbone's packed path.
Queries are short (typically 32 tokens), so the padded pass costs little.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.models.inputs import ModelInputs


class ExpansionMaskingEncoder(nn.Module):
    def __init__(self, backbone: nn.Module):
        super().__init__()
        layers = getattr(backbone, "layers", None)
        if not layers or not all(hasattr(layers[0], n) for n in (
                "qkv_proj", "o_proj", "attn_norm", "up_proj", "down_proj", "mlp_norm")):
            raise ValueError(
                f"{type(backbone).__name__}: unattended query expansion tokens are supported "
                "for BERT-family ColBERT backbones only; set attend_to_expansion_tokens=true "
                "(PyLate) / attend_to_mask_tokens=true (Stanford) to run this model.")
        self.backbone = backbone

    # The loader and pooler see the backbone through this wrapper.
    @property
    def weight_prefixes(self) -> tuple[str, ...]:
        return getattr(self.backbone, "weight_prefixes", ())

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    def get_input_embeddings(self) -> nn.Embedding:
        return self.backbone.get_input_embeddings()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self.backbone.load_weights(weights)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        unattended = getattr(inputs, "num_unattended", None)
        if not unattended or not any(unattended):
            return self.backbone(inputs)
        spans = inputs.cu_seqlens.tolist()
        masked = [i for i, n in enumerate(unattended) if n]
        packed = [i for i, n in enumerate(unattended) if not n]
        out = torch.empty(inputs.num_tokens, self.hidden_size,
                          dtype=self.backbone.word_embeddings.weight.dtype,
                          device=inputs.input_ids.device)
        if packed:
            rows = _rows(spans, packed, out.device)
            out[rows] = self.backbone(_select(inputs, packed, rows))
        # Equal-length sequences share one padded batch (queries all have query_length).
        by_len: dict[int, list[int]] = {}
        for i in masked:
            by_len.setdefault(inputs.seq_lens[i], []).append(i)
        for length, group in by_len.items():
            rows = _rows(spans, group, out.device)
            key_mask = torch.ones(len(group), length, dtype=torch.bool, device=out.device)
            for b, i in enumerate(group):
                key_mask[b, length - unattended[i]:] = False
            types = inputs.token_type_ids[rows] if inputs.token_type_ids is not None else None
            hidden = self._masked_forward(inputs.input_ids[rows].view(len(group), length),
                                          inputs.positions[rows].view(len(group), length),
                                          None if types is None else types.view(len(group), -1),
                                          key_mask)
            out[rows] = hidden.reshape(len(group) * length, -1)
        return out

    def _masked_forward(self, ids: torch.Tensor, positions: torch.Tensor,
                        token_types: torch.Tensor | None,
                        key_mask: torch.Tensor) -> torch.Tensor:
        """ids, positions, key_mask: [batch, length] -> [batch, length, hidden]; the same
        computation as the backbone's, with masked keys."""
        bb = self.backbone
        x = bb.word_embeddings(ids) + bb.position_embeddings(positions +
                                                             bb.config.position_offset)
        x = x + (bb.token_type_embeddings(token_types) if token_types is not None
                 else bb.token_type_embeddings.weight[0])
        x = bb.embed_norm(x)
        batch, length = ids.shape
        attn_mask = key_mask[:, None, None, :]  # [batch, 1, 1(query), length(key)]
        for layer in bb.layers:
            qkv = layer.qkv_proj(x).view(batch, length, 3, layer.num_heads, layer.head_dim)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # [B, heads, L, d]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            attn = attn.transpose(1, 2).reshape(batch, length, -1)
            x = layer.attn_norm(x + layer.o_proj(attn))
            x = layer.mlp_norm(x + layer.down_proj(layer.act(layer.up_proj(x))))
        return x


def _rows(spans: list[int], seqs: list[int], device) -> torch.Tensor:
    return torch.cat([torch.arange(spans[i], spans[i + 1]) for i in seqs]).to(device)


def _select(inputs: ModelInputs, seqs: list[int], rows: torch.Tensor) -> ModelInputs:
    seq_lens = [inputs.seq_lens[i] for i in seqs]
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0).tolist()), dtype=torch.int32,
                      device=inputs.cu_seqlens.device)
    return ModelInputs(
        input_ids=inputs.input_ids[rows], positions=inputs.positions[rows],
        token_type_ids=None if inputs.token_type_ids is None else inputs.token_type_ids[rows],
        cu_seqlens=cu, seq_lens=seq_lens, max_seqlen=max(seq_lens))
