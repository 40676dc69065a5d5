"""score / rerank on a cross-encoder folder saved by sentence-transformers, against
CrossEncoder.predict and CrossEncoder.rank on the same files."""
import numpy as np
import pytest
import torch

from tests.models.tiny_task_models import save_bert_task_model

QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "berlin is in germany", "a cat sat on the mat",
        "the quick brown fox jumps over the lazy dog", "france has many cities"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    st = pytest.importorskip("sentence_transformers")
    tmp = tmp_path_factory.mktemp("ce")
    base = save_bert_task_model(tmp / "base", "seq", num_labels=1, seed=7)
    model = st.CrossEncoder(str(base), device="cpu")  # default Sigmoid for one label
    model.save(str(tmp / "ce"))
    from pooler import Engine
    return Engine(str(tmp / "ce")), model


def test_score_matches_cross_encoder_predict(cross_encoder):
    engine, reference = cross_encoder
    expected = reference.predict([(QUERY, d) for d in DOCS])
    got = [o.score for o in engine.score(QUERY, DOCS)]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    pairwise = engine.score([QUERY, "berlin"], [DOCS[0], DOCS[1]])
    np.testing.assert_allclose([o.score for o in pairwise],
                               reference.predict([(QUERY, DOCS[0]), ("berlin", DOCS[1])]),
                               atol=1e-5)


def test_rerank_matches_cross_encoder_rank(cross_encoder):
    engine, reference = cross_encoder
    expected = reference.rank(QUERY, DOCS, top_k=3, return_documents=True)
    got = engine.rerank(QUERY, DOCS, top_n=3, return_documents=True)
    assert [r.index for r in got] == [e["corpus_id"] for e in expected]
    assert [r.document for r in got] == [e["text"] for e in expected]
    np.testing.assert_allclose([r.score for r in got], [e["score"] for e in expected],
                               atol=1e-5)


def test_raw_scores_are_logits(cross_encoder):
    engine, reference = cross_encoder
    raw = [o.score for o in engine.score(QUERY, DOCS, use_activation=False)]
    logits = reference.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(raw, logits, atol=1e-5)


def test_raw_scores_rejected_for_bi_encoders(minilm_engine):
    with pytest.raises(ValueError, match="apply to cross-encoders only"):
        minilm_engine.score("q", ["d"], use_activation=False)
