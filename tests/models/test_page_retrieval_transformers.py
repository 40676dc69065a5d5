"""ColPali and ColQwen2 through the Engine (transformers' retrieval classes behind pooler's
scheduler, query cache and MaxSim; pooler/worker/colvision_runner.py), on tiny seeded folders
saved by transformers: MaxSim per page and multi-vectors equal transformers run on each item
alone; pool_factor; the mm cache and the step charge."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler.pooling.token_pooling import hierarchical_pool
from tests.models.colmodernvbert_folders import page_image
from tests.models.colvision_folders import save_tiny_colpali, save_tiny_colqwen2

transformers = pytest.importorskip("transformers")

QUERIES = ["which page shows the chart", "fox"]
PAGES = [(60, 90), (100, 40), (20, 20)]  # ColQwen2 gives each its own patch grid
TOL = 1e-4


@pytest.fixture(scope="module", params=["colpali", "colqwen2"])
def folder(request, tmp_path_factory):
    save = save_tiny_colpali if request.param == "colpali" else save_tiny_colqwen2
    return save(tmp_path_factory.mktemp(request.param) / "model")


@pytest.fixture(scope="module")
def engine(folder):
    from pooler import Engine
    return Engine(str(folder), device="cpu")


@pytest.fixture(scope="module")
def reference(folder):
    from pooler.worker.colvision_fallback import ColVisionTransformers
    return ColVisionTransformers(folder)


@pytest.fixture(scope="module")
def pages():
    return [page_image(h, w, seed=i) for i, (h, w) in enumerate(PAGES)]


@torch.inference_mode()
def _alone(reference, batch) -> torch.Tensor:
    """transformers on one item, unpadded: [num_tokens, dim]."""
    batch = {k: v for k, v in batch.items() if k != "labels"}
    return reference.model(**batch).embeddings[0]


def _maxsim64(q, d) -> float:
    q, d = torch.as_tensor(q).double(), torch.as_tensor(d).double()
    return float((q @ d.T).max(dim=1).values.sum())


def test_scores_and_vectors_match_transformers(engine, reference, pages):
    processor = reference.processor
    want_q = [_alone(reference, processor.process_queries([q])) for q in QUERIES]
    want_d = [_alone(reference, processor.process_images([p])) for p in pages]
    for i, page in enumerate(pages):
        [one] = engine.score(QUERIES[0], [page])
        assert abs(one.score - _maxsim64(want_q[0], want_d[i])) <= TOL
    for o in engine.score(QUERIES[1], pages):  # every page in one step
        assert abs(o.score - _maxsim64(want_q[1], want_d[o.document_index])) <= TOL
    ranked = engine.rerank(QUERIES[0], pages)
    assert [r.index for r in ranked] == sorted(
        range(3), key=lambda j: -_maxsim64(want_q[0], want_d[j]))
    for got, want in zip(engine.encode_queries(QUERIES) + engine.encode_documents(pages),
                         want_q + want_d):
        assert got.embeddings.shape == tuple(want.shape)
        assert np.abs(got.embeddings - want.numpy()).max() <= TOL


def test_pool_factor_caches_and_charge(engine, pages):
    full = engine.encode_documents(pages)
    for f, p in zip(full, engine.encode_documents(pages, pool_factor=2)):
        want = hierarchical_pool(torch.from_numpy(f.embeddings), 2, protected_tokens=1)
        assert np.abs(p.embeddings - want.numpy()).max() <= 1e-5
    before = engine.image_cache_stats()
    assert before["encoder"] is None  # transformers runs the vision tower in its forward
    engine.score(QUERIES[0], [pages[0]])
    engine.score(QUERIES[1], [pages[0]])
    after = engine.image_cache_stats()["mm"]
    assert after.misses == before["mm"].misses and after.hits == before["mm"].hits + 2
    # a page costs its prompt tokens (image tokens included) plus the vision tower's patches
    [item] = engine.pages.build([pages[0]], "document")
    image = item.extra["image"]
    assert image.merged and image.num_tokens == len(item.prompt_token_ids) + \
        image.processed.num_vision_tokens > len(item.prompt_token_ids)
    late = engine.core.model_runner.pooling_runner.late_interaction
    assert late.num_cached_queries == 0 and late.num_pending_docs == 0


def test_bad_page_is_named(engine, pages):
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        engine.score("fox", [pages[0], b"not an image"])


def test_the_native_runner_is_refused(folder):
    from pooler.config import ModelConfig
    with pytest.raises(ValueError, match="runs on the transformers runner only"):
        ModelConfig(str(folder), runner="native")
