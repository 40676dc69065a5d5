"""ColBERT on a ModernBERT backbone (the GTE-ModernColBERT layout) against
sentence-transformers 6's MultiVectorEncoder, which loads PyLate's layout.

The folder is PyLate's layout of a ColBERT made from a seeded random tiny ModernBERT
(tests/models/colbert_folders.build_pylate): `[Q] ` / `[D] ` added to the byte-level BPE
vocabulary and inserted after [CLS], Dense 32 -> 16 without bias. Queries are padded with [MASK] and, by default, no token attends to those expansion
tokens; with a local window of 4 tokens each side, expansion tokens far from the text see
only masked keys in the local layers, which both sides must handle alike.

Token embeddings: atol 1e-4. Scores: relative 1e-4.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.models.colbert_folders import build_pylate, variant
from tests.models.modernbert_folders import build_modernbert
from tests.models.test_colbert_parity import (_assert_tokens_close, _maxsim,
                                              _multi_vector_encoder)

QUERIES = ["the cat", "fox", "modern encoders use rotary position embeddings, and local "
           "attention over the lazy dog?"]
DOCS = ["the quick brown fox jumps over the lazy dog, and the cat sat on the mat!",
        "pooler serves embedding models.", "x",
        "sparse retrieval weighs every vocabulary term of a document; a feline rested on a rug "
        "while modern encoders use rotary position embeddings and local attention " * 2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("modern_colbert")
    build_modernbert(root / "backbone", "ModernBertModel")
    # Long documents get truncated; queries are long enough to expand well past the window.
    colbert = build_pylate(root / "colbert", backbone=root / "backbone", embedding_size=16,
                           query_length=24, document_length=40)
    return {"root": root, "colbert": colbert}


def _engine(path):
    from pooler import Engine

    return Engine(str(path), device="cpu")


def _assert_parity(engine, ref):
    ref_queries = ref.queries(QUERIES)
    ours_queries = engine.encode_queries(QUERIES)
    _assert_tokens_close(ours_queries, ref_queries)
    ref_docs = ref.documents(DOCS)
    _assert_tokens_close(engine.encode_documents(DOCS), ref_docs)
    for qi, query in enumerate(QUERIES):
        expected = np.array([_maxsim(ref_queries[qi], d) for d in ref_docs], dtype=np.float32)
        ours = engine.rerank(query, DOCS)
        assert [r.index for r in ours] == list(np.argsort(-expected, kind="stable"))
        np.testing.assert_allclose([r.score for r in ours], np.sort(expected)[::-1], rtol=1e-4)
    assert engine.core.model_runner.pooling_runner.late_interaction.num_cached_queries == 0
    return ours_queries


def test_layout_and_markers(folders):
    engine = _engine(folders["colbert"])
    config = engine.model_config.colbert
    assert engine.model_config.architecture == "ModernBertModel"
    assert config.layout == "pylate" and (config.query_marker, config.document_marker) == (
        "[Q] ", "[D] ")
    assert config.needs_key_mask
    query = engine.colbert_inputs.build(["the cat"], "query")[0]
    tok = engine.colbert_inputs.tokenizer
    ids = query.prompt_token_ids
    assert len(ids) == 24
    assert ids[0] == tok.token_to_id("[CLS]") and ids[1] == tok.token_to_id("[Q] ")
    assert ids[-1] == tok.token_to_id("[MASK]")


def test_parity_expansion_not_attended(folders):
    engine = _engine(folders["colbert"])
    ref = _multi_vector_encoder(folders["colbert"])
    assert not ref.model[0].query_expansion["attend"]
    _assert_parity(engine, ref)


def test_parity_expansion_attended(folders):
    path = variant(folders["colbert"], folders["root"] / "attend",
                   st_config={"attend_to_expansion_tokens": True})
    engine = _engine(path)
    assert not engine.model_config.colbert.needs_key_mask
    attended = _assert_parity(engine, _multi_vector_encoder(path))
    # The setting changes the vectors (so the masked test above is not vacuous).
    masked = _engine(folders["colbert"]).encode_queries(QUERIES)
    assert not np.allclose(attended[0].embeddings, masked[0].embeddings, atol=1e-3)


def test_query_alone_equals_query_in_a_mixed_batch(folders):
    engine = _engine(folders["colbert"])
    batch = engine.encode_queries(QUERIES)
    for i, query in enumerate(QUERIES):
        alone = engine.encode_queries([query])[0]
        np.testing.assert_allclose(alone.embeddings, batch[i].embeddings, atol=1e-5)
