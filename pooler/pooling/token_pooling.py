"""Hierarchical token pooling: fewer vectors per document for multi-vector (ColBERT-style) indexes.

A document's token vectors are clustered with Ward linkage on cosine distance into
``max(1, n // pool_factor)`` groups and each group is replaced by its mean, so an index stores
about ``1 / pool_factor`` of the vectors. The first ``protected_tokens`` rows (the [CLS] / [D]
prefix token) are kept as they are, ahead of the pooled rows.

Behaviour matches sentence-transformers 6.2's ``HierarchicalTokenPooling`` (same distance, same
linkage, same cluster cut and order, L2-normalized output by default); with ``normalize=False``
it matches PyLate after its condensed-distance fix. Released PyLate <= 1.3.4 differs: it passes
the square distance matrix to ``linkage`` (scipy then treats its rows as observations) and puts
the protected tokens after the pooled ones.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import TypeVar

import numpy as np
import torch

Embeddings = TypeVar("Embeddings", torch.Tensor, np.ndarray)


# PoolingParams.extra key of a request's pool factor (token_embed outputs: documents' or pages'
# multi-vectors); the pooling runner applies it after the head (`pool_requests`).
POOL_FACTOR_KEY = "pool_factor"
# What the pooling runner keeps as is: the first token ([CLS]), as PyLate's default.
PROTECTED_TOKENS = 1


def check_pool_factor(pool_factor: object) -> float:
    """The validated factor (a ValueError naming the fix otherwise)."""
    return _check_pool_factor(pool_factor)


def pool_requests(outputs: list, pooling_params: list) -> list:
    """Each request's token vectors with its `pool_factor` (PoolingParams.extra) applied;
    requests without one are returned as they are."""
    out = list(outputs)
    for i, params in enumerate(pooling_params):
        factor = params.extra.get(POOL_FACTOR_KEY) if params is not None else None
        if factor is None or out[i] is None or float(factor) == 1:
            continue
        out[i] = hierarchical_pool(out[i], factor, PROTECTED_TOKENS,
                                   normalize=params.normalize is not False)
    return out


def _check_pool_factor(pool_factor: object) -> float:
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, Real):
        raise ValueError(f"pool_factor must be a number >= 1 (1 keeps every token), got {pool_factor!r}")
    if not math.isfinite(pool_factor) or pool_factor < 1:
        raise ValueError(f"pool_factor must be a finite number >= 1 (1 keeps every token), got {pool_factor!r}")
    return float(pool_factor)


def _check_protected_tokens(protected_tokens: object) -> int:
    if isinstance(protected_tokens, bool) or not isinstance(protected_tokens, Integral) or protected_tokens < 0:
        raise ValueError(f"protected_tokens must be an integer >= 0, got {protected_tokens!r}")
    return int(protected_tokens)


def _cluster_labels(to_pool: torch.Tensor, num_clusters: int) -> np.ndarray:
    """Ward clusters of float32 unit vectors ``to_pool [n, d]``: a dense label per row, 0-based.

    Labels follow scipy's cluster numbering (fcluster's ids, made dense), which fixes the order of
    the pooled rows.
    """
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    cosine_distance = (1.0 - to_pool @ to_pool.T).clamp_(0.0, 2.0).numpy()  # [n, n]
    condensed = squareform(cosine_distance, checks=False)  # [n * (n - 1) / 2], upper triangle
    tree = linkage(condensed, method="ward")
    labels = fcluster(tree, t=num_clusters, criterion="maxclust")  # [n], ids from 1
    # fcluster can return fewer ids than asked for on exact ties: renumber densely.
    _, dense = np.unique(labels, return_inverse=True)
    return dense.astype(np.int64)


def hierarchical_pool(
    embeddings: Embeddings,
    pool_factor: float,
    protected_tokens: int = 1,
    *,
    normalize: bool = True,
) -> Embeddings:
    """Pool one document's token vectors ``embeddings [n, d]`` into ``[m, d]`` rows.

    ``m = protected_tokens + max(1, (n - protected_tokens) // pool_factor)`` when that is fewer
    than ``n``; otherwise no tokens merge. ``pool_factor`` 1 returns ``embeddings`` itself.
    With ``normalize`` every output row (protected ones included) is L2-normalized, as
    sentence-transformers does; the cluster means of unit vectors are shorter than 1 otherwise.
    Returns the input's type (torch tensor or numpy array), dtype and, for tensors, device.
    Expects unit-norm rows (cosine distance is computed as ``1 - dot``).
    """
    factor = _check_pool_factor(pool_factor)
    protected = _check_protected_tokens(protected_tokens)
    is_numpy = isinstance(embeddings, np.ndarray)
    if not is_numpy and not isinstance(embeddings, torch.Tensor):
        raise ValueError(f"embeddings must be a torch.Tensor or numpy.ndarray, got {type(embeddings).__name__}")
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be 2-D [num_tokens, dim], got shape {tuple(embeddings.shape)}")
    if factor == 1:
        return embeddings

    tensor = torch.from_numpy(np.ascontiguousarray(embeddings)) if is_numpy else embeddings
    dtype, device = tensor.dtype, tensor.device
    rows = tensor.detach().cpu().float()  # [n, d]
    kept, to_pool = rows[:protected], rows[protected:]
    num_to_pool = to_pool.shape[0]
    num_clusters = max(int(num_to_pool // factor), 1)
    if num_clusters < num_to_pool:
        labels = torch.from_numpy(_cluster_labels(to_pool, num_clusters))  # [num_to_pool]
        num_found = int(labels.max()) + 1
        sums = torch.zeros(num_found, to_pool.shape[1]).index_add_(0, labels, to_pool)  # [k, d]
        counts = torch.bincount(labels, minlength=num_found).unsqueeze(1)  # [k, 1]
        rows = torch.cat([kept, sums / counts], dim=0)  # [protected + k, d]
    if normalize:
        rows = torch.nn.functional.normalize(rows, dim=-1)
    if is_numpy:
        return rows.numpy().astype(embeddings.dtype, copy=False)
    return rows.to(device=device, dtype=dtype)
