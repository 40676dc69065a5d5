"""Hierarchical token pooling vs sentence-transformers 6.2 and an independent scipy computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from pooler.pooling.token_pooling import hierarchical_pool

HierarchicalTokenPooling = pytest.importorskip(
    "sentence_transformers.multi_vector_encoder.modules").HierarchicalTokenPooling


def _unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=generator), dim=-1)  # [n, d]


def _reference(x: np.ndarray, pool_factor: float, protected: int, normalize: bool) -> np.ndarray:
    """The PyLate / sentence-transformers recipe written out in float64 numpy + scipy."""
    kept, rest = x[:protected], x[protected:]
    k = max(int(len(rest) // pool_factor), 1)
    if k < len(rest):
        labels = fcluster(linkage(pdist(rest, "cosine"), method="ward"), t=k, criterion="maxclust")
        means = [rest[labels == label].mean(axis=0) for label in np.unique(labels)]
        x = np.concatenate([kept, np.stack(means)], axis=0)
    if normalize:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    return x


@pytest.mark.parametrize("n,pool_factor,protected", [
    (32, 2, 1), (33, 3, 1), (50, 4, 0), (17, 1.5, 2), (9, 2, 1), (3, 2, 1), (2, 4, 1), (64, 8, 1)])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_sentence_transformers(n, pool_factor, protected, normalize):
    x = _unit_rows(n, 24, seed=n * 7 + protected)
    ours = hierarchical_pool(x, pool_factor, protected, normalize=normalize)
    theirs = HierarchicalTokenPooling(pool_factor, num_protected_tokens=protected,
                                      normalize_embeddings=normalize).pool_one(x.clone())
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n,pool_factor,protected", [(40, 2, 1), (41, 3, 1), (25, 4, 0)])
def test_matches_independent_float64_reference(n, pool_factor, protected):
    x = _unit_rows(n, 16, seed=100 + n).numpy()
    expected = _reference(x.astype(np.float64), pool_factor, protected, normalize=True)
    ours = hierarchical_pool(x, pool_factor, protected)
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float32
    expected_rows = protected + max((n - protected) // pool_factor, 1)
    assert ours.shape == expected.shape == (expected_rows, 16)
    np.testing.assert_allclose(ours, expected, atol=1e-5)


def test_obvious_clusters_become_their_means():
    centres = np.eye(4, 8, dtype=np.float32)  # 4 orthogonal directions
    rng = np.random.default_rng(0)
    tokens = np.repeat(centres, 3, axis=0) + 0.01 * rng.standard_normal((12, 8)).astype(np.float32)
    tokens /= np.linalg.norm(tokens, axis=1, keepdims=True)
    cls = np.full((1, 8), 1 / np.sqrt(8), dtype=np.float32)
    doc = np.concatenate([cls, tokens])  # [13, 8]
    pooled = hierarchical_pool(doc, 3, protected_tokens=1, normalize=False)  # 12 // 3 = 4 clusters
    assert pooled.shape == (5, 8)
    np.testing.assert_array_equal(pooled[0], cls[0])  # the protected token stays first, untouched
    group_means = tokens.reshape(4, 3, 8).mean(axis=1)
    order = np.argsort(pooled[1:].argmax(axis=1))
    np.testing.assert_allclose(pooled[1:][order], group_means, atol=1e-6)


def test_pool_factor_one_is_identity_and_types_round_trip():
    x = _unit_rows(10, 8, seed=3)
    assert hierarchical_pool(x, 1) is x
    half = hierarchical_pool(x.to(torch.bfloat16), 2)
    assert half.dtype == torch.bfloat16 and half.shape == (1 + 9 // 2, 8)
    assert hierarchical_pool(x[:1], 2).shape == (1, 8)  # only the protected token
    assert hierarchical_pool(x[:0], 2).shape == (0, 8)


@pytest.mark.parametrize("bad", [0, 0.5, -2, float("nan"), float("inf"), True, "2", None])
def test_bad_pool_factor_names_the_field(bad):
    with pytest.raises(ValueError, match="pool_factor"):
        hierarchical_pool(_unit_rows(4, 4, seed=0), bad)


def test_bad_protected_tokens_and_shape():
    with pytest.raises(ValueError, match="protected_tokens"):
        hierarchical_pool(_unit_rows(4, 4, seed=0), 2, protected_tokens=-1)
    with pytest.raises(ValueError, match="2-D"):
        hierarchical_pool(torch.zeros(2, 3, 4), 2)
