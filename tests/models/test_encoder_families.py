"""Native DistilBERT, ELECTRA and CamemBERT (a RoBERTa alias) against transformers on seeded
tiny models saved in the real on-disk format: hidden states (embed / token_embed), sequence
classifiers (each family's own head) and token classifiers; one text and one mixed-length
packed batch each, fp32 atol 1e-5. Mistral (a Llama alias) is in test_decoders.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.encoder_folders import (add_st_modules, hf_outputs, save_camembert,
                                          save_distilbert, save_electra)

TEXTS = ["hi", "a cat sat on the mat", "the quick brown fox jumps over the lazy dog " * 4,
         "what is the capital of france", "paris is the capital of france"]
SAVERS = {"DistilBert": save_distilbert, "Electra": save_electra, "Camembert": save_camembert}


def softmax(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x).softmax(-1).numpy()


@pytest.mark.parametrize("prefix", sorted(SAVERS))
def test_hidden_states_match_transformers(tmp_path, prefix):
    from pooler import Engine

    path = SAVERS[prefix](tmp_path / "m", "base")
    engine = Engine(str(path), task="token_embed")
    assert engine.model_config.architecture == prefix + "Model"
    assert engine.supported_tasks == {"embed", "token_embed"}
    expected = hf_outputs(path, prefix + "Model", TEXTS)
    [single] = engine.token_embed(TEXTS[2], normalize=False)
    np.testing.assert_allclose(single.embeddings, expected[2], atol=1e-5)
    outputs = engine.token_embed(TEXTS, normalize=False)  # one mixed-length packed batch
    assert len({o.num_tokens for o in outputs}) >= 3  # e.g. 3, 8 (three texts), 38 tokens
    for out, exp in zip(outputs, expected):
        assert out.embeddings.shape == exp.shape
        np.testing.assert_allclose(out.embeddings, exp, atol=1e-5)


@pytest.mark.parametrize("prefix", sorted(SAVERS))
def test_sequence_classification_matches_transformers(tmp_path, prefix):
    from pooler import Engine

    path = SAVERS[prefix](tmp_path / "seq", "seq", num_labels=3, seed=1)
    engine = Engine(str(path))
    assert engine.supported_tasks == {"classify"}
    logits = np.stack(hf_outputs(path, prefix + "ForSequenceClassification", TEXTS))
    [single] = engine.classify(TEXTS[1])
    np.testing.assert_allclose(single.probs, softmax(logits[1]), atol=1e-5)
    got = np.stack([o.probs for o in engine.classify(TEXTS, use_activation=False)])
    np.testing.assert_allclose(got, logits, atol=1e-5)
    got = np.stack([o.probs for o in engine.classify(TEXTS)])
    np.testing.assert_allclose(got, softmax(logits), atol=1e-5)


@pytest.mark.parametrize("prefix", sorted(SAVERS))
def test_token_classification_matches_transformers(tmp_path, prefix):
    from pooler import Engine

    path = SAVERS[prefix](tmp_path / "tok", "token", num_labels=5, seed=2)
    engine = Engine(str(path))
    assert engine.supported_tasks == {"token_classify"}
    expected = [softmax(x) for x in hf_outputs(path, prefix + "ForTokenClassification", TEXTS)]
    [single] = engine.token_classify(TEXTS[3])
    np.testing.assert_allclose(single.probs, expected[3], atol=1e-5)
    for out, exp in zip(engine.token_classify(TEXTS), expected):
        assert out.probs.shape == exp.shape
        np.testing.assert_allclose(out.probs, exp, atol=1e-5)


@pytest.mark.parametrize("prefix", ["DistilBert", "Electra"])
def test_cross_encoder_pairs_match_transformers(tmp_path, prefix):
    """DistilBERT takes a pair without token types, ELECTRA with them (type 1 for text b)."""
    from pooler import Engine

    path = SAVERS[prefix](tmp_path / "ce", "seq", num_labels=1, seed=3)
    pairs = ["paris", "a dog", "hello there", "foxes", "berlin"]
    logits = np.stack(hf_outputs(path, prefix + "ForSequenceClassification", TEXTS, pairs))
    got = Engine(str(path)).classify(TEXTS, text_pair=pairs, use_activation=False)
    np.testing.assert_allclose(np.stack([o.probs for o in got]), logits, atol=1e-5)


def test_distilbert_sentence_transformers_folder_matches(tmp_path):
    """msmarco-distilbert style: DistilBertModel, mean pooling, no Normalize."""
    from sentence_transformers import SentenceTransformer

    from pooler import Engine

    path = save_distilbert(tmp_path / "st", "base", seed=4)
    add_st_modules(path, "mean", normalize=False)
    expected = SentenceTransformer(str(path), device="cpu").encode(TEXTS, batch_size=3)
    got = np.stack([o.embedding for o in Engine(str(path)).embed(TEXTS, normalize=False)])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_electra_without_embedding_projection(tmp_path):
    """embedding_size == hidden_size: no embeddings_project in the checkpoint or the model."""
    from pooler import Engine

    path = save_electra(tmp_path / "flat", "base", embedding_size=32)
    engine = Engine(str(path), task="token_embed")
    assert engine.model_config.hf_config["embedding_size"] == 32
    for out, exp in zip(engine.token_embed(TEXTS, normalize=False),
                        hf_outputs(path, "ElectraModel", TEXTS)):
        np.testing.assert_allclose(out.embeddings, exp, atol=1e-5)


@pytest.mark.parametrize("prefix", ["DistilBert", "Electra"])
def test_cross_encoder_folder_score_and_rerank_match_sentence_transformers(tmp_path, prefix):
    """ms-marco-electra-base / distilbert cross-encoders: one label, Sigmoid, as CrossEncoder
    saves them; score and rerank against CrossEncoder.predict and .rank."""
    from sentence_transformers import CrossEncoder

    from pooler import Engine

    base = SAVERS[prefix](tmp_path / "base", "seq", num_labels=1, seed=5)
    reference = CrossEncoder(str(base), device="cpu")
    reference.save(str(tmp_path / "ce"))
    engine = Engine(str(tmp_path / "ce"))
    query, docs = TEXTS[3], [TEXTS[4], TEXTS[1], TEXTS[2], "berlin is in germany"]
    expected = reference.predict([(query, d) for d in docs])
    np.testing.assert_allclose([o.score for o in engine.score(query, docs)], expected,
                               atol=1e-5)
    ranked = engine.rerank(query, docs, top_n=2)
    assert [r.index for r in ranked] == [e["corpus_id"] for e in reference.rank(query, docs,
                                                                                 top_k=2)]
