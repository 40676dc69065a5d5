"""Native Gemma3 / EmbeddingGemma against transformers and sentence-transformers on seeded
tiny models saved in the real on-disk format: bidirectional (EmbeddingGemma) and causal
attention, sliding-window and global layers with their own rotary bases, GQA, the
sentence-transformers folder with Dense layers, Normalize and prompts; the task gate decided
by the config's attention (token tasks on the bidirectional model, refused on the causal one).
One text and mixed-length packed batches, fp32 atol 1e-5."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.encoder_folders import add_st_modules, save_gemma3
from tests.models.tiny_task_models import random_ids

# Longer than the sliding windows below (6 -> 3 keys each side; causal 4 -> 3 before).
LENGTHS = [5, 13, 1, 13, 20, 2]
TEXTS = ["t5 t6 t7", "t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14", "t42",
         "t9 t8 t7 t6 t5 t4 t3 t2 t1 t11 t12 t13 t14 t15 t16 t17 t18 t19 t20"]


def hf_run(path, cls_name: str, ids) -> list[np.ndarray]:
    """The reference, one unpadded sequence at a time: last hidden state or logits."""
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(path).eval()
    out = []
    for x in ids:
        with torch.no_grad():
            result = model(torch.tensor([x]))
        out.append((result.logits if hasattr(result, "logits")
                    else result.last_hidden_state)[0].numpy())
    return out


def test_bidirectional_gemma3_is_an_encoder_and_matches_transformers(tmp_path):
    from pooler import Engine

    path = save_gemma3(tmp_path / "m", "base", bidirectional=True, sliding_window=6)
    engine = Engine(str(path), task="token_embed")
    assert engine.model_config.attn_type == "encoder_only"  # from the config, not the class
    assert engine.supported_tasks == {"embed", "token_embed"}
    ids = random_ids(LENGTHS, 97)
    expected = hf_run(path, "Gemma3TextModel", ids)
    [single] = engine.token_embed(ids[4], normalize=False)
    np.testing.assert_allclose(single.embeddings, expected[4], atol=1e-5)
    for out, exp in zip(engine.token_embed(ids, normalize=False), expected):
        assert out.embeddings.shape == exp.shape
        np.testing.assert_allclose(out.embeddings, exp, atol=1e-5)
    # Without a sentence-transformers folder a bidirectional model mean-pools.
    pooled = Engine(str(path)).embed(ids, normalize=False)
    for out, exp in zip(pooled, expected):
        np.testing.assert_allclose(out.embedding, exp.mean(0), atol=1e-5)


def test_embeddinggemma_folder_matches_sentence_transformers(tmp_path):
    """EmbeddingGemma's layout: Gemma3TextModel (bidirectional, config keys as on the hub),
    mean pooling, Dense 32->64, Dense 64->32 (no bias, identity), Normalize, named prompts."""
    from sentence_transformers import SentenceTransformer

    from pooler import Engine

    path = save_gemma3(tmp_path / "st", "base", bidirectional=True, sliding_window=6, seed=1,
                       legacy_rope={"rope_theta": 1000.0, "rope_local_base_freq": 50.0,
                                    "rope_scaling": None})
    prompts = {"query": "t1 t2 t3 ", "document": "t4 t5 "}
    add_st_modules(path, "mean", normalize=True, dense=[(32, 64), (64, 32)], prompts=prompts)
    reference = SentenceTransformer(str(path), device="cpu")
    engine = Engine(str(path))
    assert engine.supported_tasks == {"embed", "token_embed"}
    for prompt_name in ("query", "document"):
        expected = reference.encode(TEXTS, prompt_name=prompt_name, batch_size=2)
        assert expected.shape == (len(TEXTS), 32)
        [single] = engine.embed(TEXTS[1], prompt_name=prompt_name)
        np.testing.assert_allclose(single.embedding, expected[1], atol=1e-5)
        got = np.stack([o.embedding for o in engine.embed(TEXTS, prompt_name=prompt_name)])
        np.testing.assert_allclose(got, expected, atol=1e-5)
    plain = np.stack([o.embedding for o in engine.embed(TEXTS)])
    np.testing.assert_allclose(plain, reference.encode(TEXTS), atol=1e-5)


def test_causal_gemma3_refuses_token_tasks_and_matches_transformers(tmp_path):
    from pooler import Engine

    path = save_gemma3(tmp_path / "c", "causal", bidirectional=False, sliding_window=4)
    with pytest.raises(ValueError, match="Set an explicitly supported task: task='embed'"):
        Engine(str(path), task="token_embed")
    engine = Engine(str(path))
    assert engine.model_config.attn_type == "decoder"
    assert engine.supported_tasks == {"embed"}
    ids = random_ids(LENGTHS, 97)
    expected = hf_run(path, "Gemma3TextModel", ids)
    for out, exp in zip(engine.embed(ids, normalize=False), expected):
        np.testing.assert_allclose(out.embedding, exp[-1], atol=1e-5)  # last token


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gemma3_sequence_classification_matches_transformers(tmp_path, bidirectional):
    """The `score` head on the last non-pad token, whatever the attention."""
    from pooler import Engine

    path = save_gemma3(tmp_path / "seq", "seq", bidirectional=bidirectional, sliding_window=4,
                       num_labels=3, seed=2)
    ids = random_ids(LENGTHS, 97)
    ids.append([5, 6, 7, 0, 0])  # ends in the pad id: transformers scores token 7
    logits = np.stack(hf_run(path, "Gemma3TextForSequenceClassification", ids))
    engine = Engine(str(path))
    assert engine.supported_tasks == {"classify"}
    got = np.stack([o.probs for o in engine.classify(ids, use_activation=False)])
    np.testing.assert_allclose(got, logits, atol=1e-5)


def test_gemma3_legacy_rope_keys_with_linear_scaling(tmp_path):
    """Older configs: rope_theta, rope_local_base_freq and a linear rope_scaling on the global
    layers (Gemma3 4B and up)."""
    from pooler import Engine

    path = save_gemma3(tmp_path / "lin", "causal", bidirectional=False, sliding_window=4,
                       seed=3, legacy_rope={"rope_theta": 500.0, "rope_local_base_freq": 20.0,
                                            "rope_scaling": {"rope_type": "linear",
                                                             "factor": 4.0}})
    ids = random_ids(LENGTHS, 97, seed=1)
    expected = hf_run(path, "Gemma3TextModel", ids)
    for out, exp in zip(Engine(str(path)).embed(ids, normalize=False), expected):
        np.testing.assert_allclose(out.embedding, exp[-1], atol=1e-5)
