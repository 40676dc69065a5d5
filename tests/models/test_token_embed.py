"""token_embed on all-MiniLM-L6-v2 (sentence-transformers folder with Normalize) and a tiny
random BERT, against transformers' last_hidden_state."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.tiny_task_models import minilm_path, save_bert_task_model

TEXTS = ["The cat sat on the mat.", "hi", "pooler serves embedding models, token by token"]


@pytest.fixture(scope="module")
def minilm():
    from transformers import AutoModel, AutoTokenizer

    from pooler import Engine

    path = minilm_path()
    return (Engine("sentence-transformers/all-MiniLM-L6-v2"),
            AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path))


def hidden_states(model, tokenizer, text):
    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()


def test_token_embed_matches_last_hidden_state(minilm):
    engine, model, tokenizer = minilm
    outputs = engine.token_embed(TEXTS, normalize=False)  # one mixed-length batch
    for text, out in zip(TEXTS, outputs):
        expected = hidden_states(model, tokenizer, text)
        assert out.embeddings.shape == expected.shape == (out.num_tokens, 384)
        np.testing.assert_allclose(out.embeddings, expected, atol=1e-4)


def test_token_embed_normalizes_as_the_model_says(minilm):
    engine, model, tokenizer = minilm
    [out] = engine.token_embed(TEXTS[0])  # the folder has a Normalize module
    np.testing.assert_allclose(np.linalg.norm(out.embeddings, axis=1), 1.0, atol=1e-5)
    expected = hidden_states(model, tokenizer, TEXTS[0])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out.embeddings, expected, atol=1e-4)


def test_skip_special_tokens_drops_cls_and_sep(minilm):
    engine, _, tokenizer = minilm
    [full] = engine.token_embed(TEXTS[2], normalize=False)
    [kept] = engine.token_embed(TEXTS[2], normalize=False, skip_special_tokens=True)
    assert kept.embeddings.shape == (full.embeddings.shape[0] - 2, 384)
    np.testing.assert_allclose(kept.embeddings, full.embeddings[1:-1], atol=1e-6)


def test_token_embed_on_a_tiny_bert_without_sentence_transformers_layout(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    from pooler import Engine

    path = save_bert_task_model(tmp_path / "m", "base")
    engine = Engine(str(path), task="token_embed")
    model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    for text, out in zip(TEXTS, engine.token_embed(TEXTS, normalize=False)):
        np.testing.assert_allclose(out.embeddings, hidden_states(model, tokenizer, text),
                                   atol=1e-5)
    # without a sentence-transformers layout, token vectors are normalized by default
    [out] = engine.token_embed("hi")
    np.testing.assert_allclose(np.linalg.norm(out.embeddings, axis=1), 1.0, atol=1e-5)
