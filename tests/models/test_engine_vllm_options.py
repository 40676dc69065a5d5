"""The Engine options the vLLM routes rely on, offline: use_activation on embeddings (the L2
normalization), add_special_tokens, a reranker's max_tokens_per_doc and the tokens counted per
scored pair, and over-long inputs as InputTooLongError. References: transformers models and
tokenizers on the same seeded folders."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.engine.input_processor import InputTooLongError
from tests.models.tiny_task_models import save_bert_task_model

QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france and the quick brown fox jumps over the lazy dog",
        "berlin is in germany", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def hf_minilm_tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


def test_use_activation_false_is_the_unnormalized_embedding(minilm_engine, minilm_path,
                                                             hf_minilm_tokenizer):
    from transformers import AutoModel

    texts = ["a short one", "a somewhat longer sentence about cats and dogs"]
    raw = np.stack([o.embedding for o in minilm_engine.embed(texts, use_activation=False)])
    # all-MiniLM-L6-v2 without its Normalize module: masked mean pooling of the transformer.
    model = AutoModel.from_pretrained(str(minilm_path)).eval()
    batch = hf_minilm_tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # [batch, tokens, 384]
    mask = batch["attention_mask"].unsqueeze(-1).float()
    reference = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(raw, reference, atol=1e-5)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    default = np.stack([o.embedding for o in minilm_engine.embed(texts)])
    np.testing.assert_allclose(default, raw / np.linalg.norm(raw, axis=1, keepdims=True),
                               atol=1e-6)
    same = np.stack([o.embedding for o in minilm_engine.embed(texts, use_activation=True,
                                                              normalize=True)])
    np.testing.assert_allclose(same, default, atol=1e-7)
    with pytest.raises(ValueError, match="disagree"):
        minilm_engine.embed(texts, use_activation=False, normalize=True)


def test_add_special_tokens_false(minilm_engine, hf_minilm_tokenizer):
    text = "pooler serves embedding models"
    got = minilm_engine.embed([text], add_special_tokens=False)[0]
    ids = hf_minilm_tokenizer.encode(text, add_special_tokens=False)
    assert got.num_tokens == len(ids)
    np.testing.assert_allclose(got.embedding, minilm_engine.embed([ids])[0].embedding,
                               atol=1e-6)


def test_over_long_input_is_an_input_too_long_error(minilm_engine):
    with pytest.raises(InputTooLongError) as info:
        minilm_engine.embed(["a short one", "word " * 400], truncate=False)
    assert (info.value.index, info.value.max_length) == (1, 256)
    assert info.value.num_tokens == 402


def _reference_scores(folder, tokenizer, query, docs, max_doc_tokens, max_length):
    """transformers: the document cut to max_doc_tokens, the pair truncated longest-first."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    scores, lengths = [], []
    for doc in docs:
        # The document's first max_doc_tokens tokens as text (re-encoding gives them back).
        ids = tokenizer.encode(doc, add_special_tokens=False)[:max_doc_tokens]
        cut = tokenizer.decode(ids).strip()
        assert tokenizer.encode(cut, add_special_tokens=False) == ids
        enc = tokenizer(query, cut, truncation="longest_first", max_length=max_length,
                        return_tensors="pt")
        with torch.no_grad():
            logits = model(**enc).logits
        scores.append(float(torch.sigmoid(logits)[0, 0]))
        lengths.append(int(enc["input_ids"].shape[1]))
    return scores, lengths


@pytest.fixture(scope="module")
def bert_reranker_folder(tmp_path_factory):
    return save_bert_task_model(tmp_path_factory.mktemp("bert"), "seq", num_labels=1, seed=3)


@pytest.mark.parametrize("max_doc_tokens,max_length", [(4, 64), (12, 64), (12, 14), (30, 12),
                                                       (3, 9)])
def test_max_tokens_per_doc_matches_transformers(bert_reranker_folder, max_doc_tokens,
                                                 max_length):
    """Documents cut to max_doc_tokens, then pairs truncated longest-first to max_length
    (both texts cut when the shorter one does not fit in half)."""
    from transformers import AutoTokenizer

    folder = bert_reranker_folder
    engine = Engine(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    expected, lengths = _reference_scores(folder, tokenizer, QUERY, DOCS, max_doc_tokens,
                                          max_length)
    got = engine.score(QUERY, DOCS, max_tokens_per_doc=max_doc_tokens,
                       truncate_prompt_tokens=max_length)
    np.testing.assert_allclose([o.score for o in got], expected, atol=1e-5)
    assert [o.num_tokens for o in got] == lengths


def test_score_tokens_per_pair_and_bad_max_tokens_per_doc(minilm_engine, hf_minilm_tokenizer,
                                                         tmp_path):
    # Bi-encoder: each query counted once, on its first pair, plus each pair's document.
    q = len(hf_minilm_tokenizer.encode(QUERY))
    d = [len(hf_minilm_tokenizer.encode(x)) for x in DOCS]
    got = minilm_engine.score(QUERY, DOCS)
    assert [o.num_tokens for o in got] == [q + d[0], d[1], d[2]]
    cut = minilm_engine.score(QUERY, DOCS, max_tokens_per_doc=5)
    assert [o.num_tokens for o in cut] == [q + 5, 5, 5]
    for bad in (0, -5, True):
        with pytest.raises(ValueError, match="max_tokens_per_doc must be a positive integer"):
            minilm_engine.score(QUERY, DOCS, max_tokens_per_doc=bad)
    engine = Engine(str(save_bert_task_model(tmp_path, "seq", num_labels=1)))
    pairs = engine.score(QUERY, DOCS)
    assert [o.num_tokens for o in pairs] == [len(hf_minilm_tokenizer.encode(QUERY, x))
                                             for x in DOCS]
