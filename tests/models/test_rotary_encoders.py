"""NomicBert, GTE, Jina v3 and EuroBERT on the native runner (one shared rotary block) against
transformers' own classes and sentence-transformers folders, on seeded tiny random models
saved by transformers (fp32, atol 1e-5; single inputs and mixed-length batches).

These classes exist from transformers 5.24; the tests skip with the reason on older ones.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.params import PoolingParams
from tests.models.rotary_folders import FAMILIES, TEXTS, build_family, require_family

ATOL = 1e-5
ALL = list(FAMILIES)


def _reference(model, folder, texts=TEXTS):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(texts, padding=True, return_tensors="pt")
    batch.pop("token_type_ids", None) if "eurobert" in type(model).__name__.lower() else None
    with torch.no_grad():
        out = model(**batch)
    return batch["attention_mask"].sum(1).tolist(), out


@pytest.fixture(scope="module", params=ALL)
def base_folder(request, tmp_path_factory):
    require_family(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, build_family(folder, request.param)


def test_hidden_states_match_transformers(base_folder):
    family, folder, model = base_folder
    lengths, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu", runner="native")
    batched = engine.token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, batched)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL, err_msg=f"{family} text {i} in a batch")
    for i, text in enumerate(TEXTS):  # each text alone
        alone = engine.token_embed(text, normalize=False)[0]
        np.testing.assert_allclose(alone.embeddings, ref.last_hidden_state[i, :lengths[i]].numpy(),
                                   atol=ATOL, err_msg=f"{family} text {i} alone")


def test_sentence_transformers_folder(base_folder, tmp_path):
    from sentence_transformers import SentenceTransformer, models

    family, folder, _ = base_folder
    transformer = models.Transformer(str(folder))
    dimension = getattr(transformer, "get_embedding_dimension", None) or \
        transformer.get_word_embedding_dimension
    pooling = models.Pooling(dimension(), "mean")
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    st_folder = tmp_path / "st"
    st.save(str(st_folder))
    reference = SentenceTransformer(str(st_folder), device="cpu")
    expected = reference.encode(TEXTS)
    engine = Engine(str(st_folder), device="cpu", runner="native")
    got = engine.embed(TEXTS)
    np.testing.assert_allclose(np.stack([o.embedding for o in got]), expected, atol=ATOL)
    for text, row in zip(TEXTS[:2], expected[:2]):
        np.testing.assert_allclose(engine.embed(text)[0].embedding, row, atol=ATOL)


@pytest.mark.parametrize("family", ALL)
def test_sequence_classification(tmp_path, family):
    require_family(family, "ForSequenceClassification")
    folder = tmp_path / "cls"
    model = build_family(folder, family, "ForSequenceClassification", seed=1)
    _, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu", runner="native")
    assert engine.default_task == "classify"
    logits = engine.encode(TEXTS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(np.stack([o.data for o in logits]), ref.logits.numpy(), atol=ATOL)
    probs = engine.encode(TEXTS[1])
    np.testing.assert_allclose(probs[0].data, torch.softmax(ref.logits[1], -1).numpy(),
                               atol=ATOL)


@pytest.mark.parametrize("pooling", ["bos", "mean"])
def test_eurobert_classifier_pooling(tmp_path, pooling):
    """EuroBERT's head pools first ("bos", "mean") or averages per-token logits ("late", the
    default, tested above)."""
    require_family("eurobert", "ForSequenceClassification")
    folder = tmp_path / "cls"
    model = build_family(folder, "eurobert", "ForSequenceClassification", seed=4,
                         classifier_pooling=pooling)
    _, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu", runner="native")
    logits = engine.encode(TEXTS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(np.stack([o.data for o in logits]), ref.logits.numpy(), atol=ATOL)


@pytest.mark.parametrize("family", ALL)
def test_token_classification(tmp_path, family):
    require_family(family, "ForTokenClassification")
    folder = tmp_path / "tok"
    model = build_family(folder, family, "ForTokenClassification", seed=2)
    lengths, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu", runner="native")
    assert engine.default_task == "token_classify"
    logits = engine.encode(TEXTS, PoolingParams(task="token_classify", use_activation=False))
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(logits[i].data, ref.logits[i, :n].numpy(), atol=ATOL)


def test_nomic_pair_uses_token_types(tmp_path):
    """NomicBert has two token types: a (query, document) pair classified natively matches
    transformers fed the tokenizer's token_type_ids."""
    require_family("nomic_bert", "ForSequenceClassification")
    from transformers import AutoTokenizer

    folder = tmp_path / "pair"
    model = build_family(folder, "nomic_bert", "ForSequenceClassification", seed=5)
    _pairs_with_token_types(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    pairs = [("the cat", "a feline rested on a rug"), ("fox", "the quick brown fox jumps")]
    batch = tok([p[0] for p in pairs], [p[1] for p in pairs], padding=True,
                return_tensors="pt", return_token_type_ids=True)
    assert batch["token_type_ids"].any()
    with torch.no_grad():
        ref = model(**batch).logits
    engine = Engine(str(folder), device="cpu", runner="native")
    got = engine.classify([p[0] for p in pairs], text_pair=[p[1] for p in pairs],
                          use_activation=False)
    np.testing.assert_allclose(np.stack([o.probs for o in got]), ref.numpy(), atol=ATOL)


def _pairs_with_token_types(folder):
    """Make the tokenizer mark the second text of a pair as token type 1 (BERT's template)."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tok.save(str(folder / "tokenizer.json"))


def test_gte_reranker_scores_pairs(tmp_path):
    """The GTE reranker family: (query, document) pairs scored natively equal transformers'
    logits on the tokenizer's pair encoding."""
    require_family("gte", "ForSequenceClassification")
    from transformers import AutoTokenizer

    folder = tmp_path / "rerank"
    model = build_family(folder, "gte", "ForSequenceClassification", seed=6, num_labels=1,
                         id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    query, docs = "the cat", ["a feline rested on a rug", "fox", "pooler serves models"]
    batch = AutoTokenizer.from_pretrained(folder)([query] * 3, docs, padding=True,
                                                  return_tensors="pt")
    with torch.no_grad():
        ref = model(**batch).logits[:, 0]
    engine = Engine(str(folder), device="cpu", runner="native")
    scores = engine.score(query, docs, use_activation=False)
    np.testing.assert_allclose([s.score for s in scores], ref.numpy(), atol=ATOL)


def test_bfloat16_runs_close_to_fp32(base_folder):
    """bf16 takes the same block (no fp32-only fast path): close to fp32, not equal."""
    _, folder, _ = base_folder
    fp32 = Engine(str(folder), device="cpu").embed(TEXTS, normalize=True)
    bf16 = Engine(str(folder), device="cpu", dtype="bfloat16").embed(TEXTS, normalize=True)
    for a, b in zip(fp32, bf16):
        assert float(np.dot(a.embedding, b.embedding)) > 0.98
