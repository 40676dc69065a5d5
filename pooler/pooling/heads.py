"""What a pooler does with the selected tokens: projections, normalization, truncation."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.activations import get_activation
from pooler.model_folder import STDense
from pooler.params import PoolingParams


class DenseProjector(nn.Module):
    """The sentence-transformers `Dense` modules after pooling (Linear + activation each)."""

    def __init__(self, dense_modules: list[STDense]):
        super().__init__()
        self.specs = dense_modules
        self.linears = nn.ModuleList(
            nn.Linear(d.in_features, d.out_features, bias=d.bias) for d in dense_modules)
        self.activations = [get_activation(d.activation) for d in dense_modules]

    @property
    def out_features(self) -> int | None:
        return self.specs[-1].out_features if self.specs else None

    def load_own_weights(self) -> None:
        """Each Dense module keeps its weights in its own folder."""
        from pooler.checkpoint import iterate_weights

        for spec, linear in zip(self.specs, self.linears):
            state = dict(iterate_weights(spec.path))
            with torch.no_grad():  # copy_ keeps the model's dtype and device
                linear.weight.copy_(state["linear.weight"])
                if spec.bias:
                    linear.bias.copy_(state["linear.bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        for linear, act in zip(self.linears, self.activations):
            x = act(linear(x))
        return x


def finalize_embeddings(vectors: torch.Tensor,
                        params: list[PoolingParams]) -> list[torch.Tensor]:
    """Matryoshka truncation then optional L2 normalization, per request.

    vectors: [num_reqs, dim] -> num_reqs tensors of [dimensions or dim]."""
    dim = vectors.shape[-1]
    out = []
    for vector, p in zip(vectors, params):
        if p.dimensions is not None:
            if p.dimensions > dim:
                raise ValueError(f"dimensions={p.dimensions} is larger than the model's "
                                 f"embedding size {dim}.")
            vector = vector[: p.dimensions]
        if p.normalize:
            vector = F.normalize(vector.float(), p=2, dim=-1).to(vector.dtype)
        out.append(vector)
    return out


def finalize_token_embeddings(tokens: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """Optional Matryoshka truncation then L2 normalization of every token vector.

    tokens: [num_tokens, dim] -> [num_tokens, dimensions or dim]."""
    if params.dimensions is not None:
        if params.dimensions > tokens.shape[-1]:
            raise ValueError(f"dimensions={params.dimensions} is larger than the "
                             f"model's token embedding size {tokens.shape[-1]}.")
        tokens = tokens[:, : params.dimensions]
    if params.normalize:
        tokens = F.normalize(tokens.float(), p=2, dim=-1).to(tokens.dtype)
    return tokens
