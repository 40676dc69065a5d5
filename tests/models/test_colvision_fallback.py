"""The transformers fallback for ColVision retrieval models (pooler/worker/colvision_fallback.py):
a padded batch of queries or pages gives each item's masked multi-vectors equal to the item run
alone through transformers (no padding), MaxSim equal to the processor's score_retrieval, on
tiny seeded ColPali and ColQwen2 folders; for ColModernVBert it equals pooler's native model."""
from __future__ import annotations

import pytest
import torch

from pooler.worker.colvision_fallback import ColVisionTransformers
from tests.models.colmodernvbert_folders import NativeColModernVBert, page_image, \
    save_tiny_colmodernvbert
from tests.models.colvision_folders import save_tiny_colpali, save_tiny_colqwen2

transformers = pytest.importorskip("transformers")

QUERIES = ["which page shows the chart", "fox", "the lazy dog and a quarterly report"]
PAGES = [(60, 90), (100, 40), (20, 20)]  # (height, width): ColQwen2 gives each its own grid
TOL = 1e-4


@torch.inference_mode()
def _alone(fallback, batch) -> torch.Tensor:
    """One item through transformers directly, unpadded: [num_tokens, dim]."""
    batch = {k: v for k, v in batch.items() if k != "labels"}
    assert bool(batch["attention_mask"].all())
    return fallback.model(**batch).embeddings[0]


def _maxsim64(queries, docs) -> torch.Tensor:
    return torch.tensor([[float((q.double() @ d.double().T).max(dim=1).values.sum())
                          for d in docs] for q in queries], dtype=torch.float64)


@pytest.mark.parametrize("save", [save_tiny_colpali, save_tiny_colqwen2],
                         ids=["colpali", "colqwen2"])
def test_batched_vectors_equal_each_item_alone(tmp_path, save):
    fallback = ColVisionTransformers(save(tmp_path / "model"))
    processor = fallback.processor
    images = [page_image(h, w, seed=i) for i, (h, w) in enumerate(PAGES)]
    docs = fallback.encode_images(images)
    queries = fallback.encode_queries(QUERIES)
    assert all(d.shape[1] == fallback.embedding_dim for d in docs + queries)
    for image, got in zip(images, docs):
        want = _alone(fallback, processor.process_images([image]))
        assert got.shape == want.shape
        assert (got - want).abs().max() <= TOL
    for query, got in zip(QUERIES, queries):
        want = _alone(fallback, processor.process_queries([query]))
        assert got.shape == want.shape
        assert (got - want).abs().max() <= TOL
    norms = torch.cat(docs + queries).norm(dim=-1)
    assert (norms - 1).abs().max() <= 1e-5  # padding rows were dropped, not kept as zeros
    # score_retrieval zero-pads documents to one length, which lifts a query token's max to 0
    # where all its similarities are negative: score each page alone (no padding)
    scores = torch.cat([processor.score_retrieval(queries, [d]) for d in docs], dim=1).double()
    assert (scores - _maxsim64(queries, docs)).abs().max() <= TOL


def test_fallback_equals_native_colmodernvbert(tmp_path):
    folder = save_tiny_colmodernvbert(tmp_path / "colmodernvbert")
    fallback = ColVisionTransformers(folder)
    images = [page_image(60, 90, 0), page_image(100, 30, 1)]
    want = fallback.encode_queries(QUERIES[:2]) + fallback.encode_images(images)
    got, _ = NativeColModernVBert(folder).run(QUERIES[:2], images)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) <= TOL


def test_not_a_colvision_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"]}')
    with pytest.raises(ValueError, match="not a ColVision retrieval model"):
        ColVisionTransformers(tmp_path)
