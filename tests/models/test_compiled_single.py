"""POOLER_COMPILE_SINGLE_QUERY=1: one-sequence steps take the compiled forward
(pooler/worker/compiled_single.py) and still match sentence-transformers at 1e-5; batches of
several sequences keep the packed path. Slow (one inductor compile), so marked slow."""
from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny import add_st_pooling, save_tiny_bert


@pytest.mark.slow
def test_compiled_single_query_matches_sentence_transformers(tmp_path, minilm_path,
                                                              monkeypatch):
    st = pytest.importorskip("sentence_transformers")
    from pooler.engine.llm import Engine

    folder = save_tiny_bert(tmp_path / "bert", minilm_path, seed=5)
    add_st_pooling(folder, "mean", normalize=True)
    monkeypatch.setenv("POOLER_COMPILE_SINGLE_QUERY", "1")
    engine = Engine(str(folder))
    runner = engine.core.model_runner
    assert runner.single_forward is not None
    calls = []
    compiled = runner.single_forward
    runner.single_forward = lambda ids, types: calls.append(len(ids)) or compiled(ids, types)
    texts = ["a short query", "The cat sat on the mat while the dog slept.", "x y z"]
    reference = st.SentenceTransformer(str(folder), device="cpu").encode(texts)
    single = np.stack([engine.embed(t)[0].embedding for t in texts])
    np.testing.assert_allclose(single, reference, atol=1e-5)
    assert len(calls) == 3  # every single query went through the compiled forward
    batched = np.stack([o.embedding for o in engine.embed(texts)])
    np.testing.assert_allclose(batched, reference, atol=1e-5)
    assert len(calls) == 3  # the batch took the packed path
