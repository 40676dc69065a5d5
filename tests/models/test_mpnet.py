"""Native MPNet against transformers and sentence-transformers on seeded tiny models saved in
the real on-disk format: hidden states, an all-mpnet-base-v2 style sentence-transformers
folder (mean pooling + Normalize), sequence and token classifiers; one text and mixed-length
packed batches (the relative position bias is per sequence), fp32 atol 1e-5."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.encoder_folders import add_st_modules, hf_outputs, save_mpnet

# Lengths from 3 to ~70 tokens: long enough that the log-spaced buckets (distance >= 8) and
# both signs of the relative position are exercised; two equal-length texts share one call.
TEXTS = ["hi", "a cat sat on the mat",
         "the quick brown fox jumps over the lazy dog " * 7,
         "what is the capital of france", "paris is the capital of france",
         "pooler serves embedding models on packed batches without padding " * 3]


def test_relative_position_buckets_equal_transformers():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from pooler.models.mpnet import relative_position_buckets

    for length in (1, 7, 40, 300):
        pos = torch.arange(length)
        expected = MPNetEncoder.relative_position_bucket(pos[None, :] - pos[:, None])
        assert torch.equal(relative_position_buckets(length, torch.device("cpu")), expected)


def test_mpnet_hidden_states_match_transformers_single_and_batch(tmp_path):
    from pooler import Engine

    path = save_mpnet(tmp_path / "m", "base")
    engine = Engine(str(path), task="token_embed")
    assert engine.model_config.architecture == "MPNetModel"
    expected = hf_outputs(path, "MPNetModel", TEXTS)
    [single] = engine.token_embed(TEXTS[2], normalize=False)
    np.testing.assert_allclose(single.embeddings, expected[2], atol=1e-5)
    outputs = engine.token_embed(TEXTS, normalize=False)  # one mixed-length packed batch
    assert len({o.num_tokens for o in outputs}) == 4  # 3, 8 (twice), 44, 65 tokens
    for out, exp in zip(outputs, expected):
        assert out.embeddings.shape == exp.shape
        np.testing.assert_allclose(out.embeddings, exp, atol=1e-5)


def test_mpnet_sentence_transformers_folder_matches(tmp_path):
    """The all-mpnet-base-v2 layout: MPNetModel, mean pooling, Normalize."""
    from sentence_transformers import SentenceTransformer

    from pooler import Engine

    path = save_mpnet(tmp_path / "st", "base", seed=1)
    add_st_modules(path, "mean", normalize=True, max_seq_length=128)
    expected = SentenceTransformer(str(path), device="cpu").encode(TEXTS, batch_size=4)
    engine = Engine(str(path))
    assert engine.supported_tasks == {"embed", "token_embed"}
    [single] = engine.embed(TEXTS[0])
    np.testing.assert_allclose(single.embedding, expected[0], atol=1e-5)
    got = np.stack([o.embedding for o in engine.embed(TEXTS)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_mpnet_sequence_classification_matches_transformers(tmp_path):
    from pooler import Engine

    path = save_mpnet(tmp_path / "seq", "seq", num_labels=3, seed=2)
    engine = Engine(str(path))
    assert engine.supported_tasks == {"classify"}
    logits = np.stack(hf_outputs(path, "MPNetForSequenceClassification", TEXTS))
    expected = torch.tensor(logits).softmax(-1).numpy()
    [single] = engine.classify(TEXTS[1])
    np.testing.assert_allclose(single.probs, expected[1], atol=1e-5)
    got = np.stack([o.probs for o in engine.classify(TEXTS)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    raw = np.stack([o.probs for o in engine.classify(TEXTS, use_activation=False)])
    np.testing.assert_allclose(raw, logits, atol=1e-5)


def test_mpnet_cross_encoder_pairs_match_transformers(tmp_path):
    """MPNet has no token type embeddings: a pair is just `<s> a </s></s> b </s>`."""
    from pooler import Engine

    path = save_mpnet(tmp_path / "ce", "seq", num_labels=1, seed=3)
    engine = Engine(str(path))
    pairs = ["paris", "a dog", "hello there", "foxes", "berlin", "tokens"]
    logits = np.stack(hf_outputs(path, "MPNetForSequenceClassification", TEXTS, pairs))
    got = np.stack([o.probs for o in engine.classify(TEXTS, text_pair=pairs,
                                                     use_activation=False)])
    np.testing.assert_allclose(got, logits, atol=1e-5)


def test_mpnet_token_classification_matches_transformers(tmp_path):
    from pooler import Engine

    path = save_mpnet(tmp_path / "tok", "token", num_labels=5, seed=4)
    engine = Engine(str(path))
    assert engine.supported_tasks == {"token_classify"}
    expected = [torch.tensor(x).softmax(-1).numpy()
                for x in hf_outputs(path, "MPNetForTokenClassification", TEXTS)]
    [single] = engine.token_classify(TEXTS[3])
    np.testing.assert_allclose(single.probs, expected[3], atol=1e-5)
    for out, exp in zip(engine.token_classify(TEXTS), expected):
        assert out.probs.shape == exp.shape
        np.testing.assert_allclose(out.probs, exp, atol=1e-5)


def test_mpnet_checkpoint_without_the_bias_table_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from pooler import Engine

    path = save_mpnet(tmp_path / "broken", "base")
    weights = load_file(str(path / "model.safetensors"))
    del weights["encoder.relative_attention_bias.weight"]
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="relative_attention_bias"):
        Engine(str(path))
