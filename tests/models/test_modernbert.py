"""ModernBERT parity with transformers 5.3 on seeded random tiny models (fp32, atol 1e-4).

Sequences are longer than the local window (local_attention=8: 4 tokens each side), so the
sliding-window layers matter, and every batch mixes lengths.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.params import PoolingParams
from tests.models.modernbert_folders import TEXTS, build_modernbert

ATOL = 1e-4


def _reference(model, folder, texts=TEXTS, **call):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, **call)
    return batch["attention_mask"].sum(1).tolist(), out


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modernbert_base")
    model = build_modernbert(folder, "ModernBertModel")
    return folder, model


def test_hidden_states_match_transformers(base_folder):
    folder, model = base_folder
    lengths, ref = _reference(model, folder)
    assert max(lengths) > 4 * 8, "a sequence must exceed the local window several times"
    engine = Engine(str(folder), device="cpu")
    outputs = engine.token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, outputs)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL, err_msg=f"text {i}")
    # CLS embedding (the default for a plain folder) is the first hidden state.
    cls = engine.embed(TEXTS, normalize=False)
    for i, out in enumerate(cls):
        np.testing.assert_allclose(out.embedding, ref.last_hidden_state[i, 0].numpy(), atol=ATOL)


def test_local_attention_is_exercised(base_folder):
    """The long texts give different states if every layer were global: the window matters."""
    import transformers

    folder, model = base_folder
    config = transformers.AutoConfig.from_pretrained(folder)
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    all_global = transformers.ModernBertModel(config)
    all_global.load_state_dict(model.state_dict())
    lengths, ref = _reference(model, folder)
    _, ref_global = _reference(all_global.eval(), folder)
    longest = int(np.argmax(lengths))
    diff = (ref.last_hidden_state[longest, :lengths[longest]]
            - ref_global.last_hidden_state[longest, :lengths[longest]]).abs().max()
    assert diff > 1e-2


def test_single_equals_batched(base_folder):
    folder, _ = base_folder
    engine = Engine(str(folder), device="cpu")
    batched = engine.embed(TEXTS, normalize=False)
    for text, out in zip(TEXTS, batched):
        alone = engine.embed(text, normalize=False)[0]
        np.testing.assert_allclose(alone.embedding, out.embedding, atol=1e-5)


def test_sentence_transformers_folder_mean_pooling(base_folder, tmp_path):
    from sentence_transformers import SentenceTransformer, models

    folder, _ = base_folder
    transformer = models.Transformer(str(folder))
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), "mean")
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    st_folder = tmp_path / "st"
    st.save(str(st_folder))
    expected = SentenceTransformer(str(st_folder), device="cpu").encode(TEXTS)
    got = Engine(str(st_folder), device="cpu").embed(TEXTS)
    np.testing.assert_allclose(np.stack([o.embedding for o in got]), expected, atol=ATOL)


@pytest.mark.parametrize("classifier_pooling", ["cls", "mean"])
def test_sequence_classification(tmp_path, classifier_pooling):
    folder = tmp_path / "cls"
    model = build_modernbert(folder, "ModernBertForSequenceClassification", seed=1,
                             classifier_pooling=classifier_pooling, classifier_bias=True)
    _, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu")
    assert engine.default_task == "classify"
    probs = engine.encode(TEXTS)
    logits = engine.encode(TEXTS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(np.stack([o.data for o in logits]), ref.logits.numpy(), atol=ATOL)
    np.testing.assert_allclose(np.stack([o.data for o in probs]),
                               torch.softmax(ref.logits, -1).numpy(), atol=ATOL)


def test_token_classification(tmp_path):
    folder = tmp_path / "tok"
    model = build_modernbert(folder, "ModernBertForTokenClassification", seed=2)
    lengths, ref = _reference(model, folder)
    engine = Engine(str(folder), device="cpu")
    assert engine.default_task == "token_classify"
    logits = engine.encode(TEXTS, PoolingParams(task="token_classify", use_activation=False))
    probs = engine.encode(TEXTS)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(logits[i].data, ref.logits[i, :n].numpy(), atol=ATOL)
        np.testing.assert_allclose(probs[i].data, torch.softmax(ref.logits[i, :n], -1).numpy(),
                                   atol=ATOL)
    # Dropping [CLS]/[SEP] leaves the inner tokens.
    inner = engine.encode(TEXTS[:1], PoolingParams(task="token_classify",
                                                   skip_special_tokens=True))
    np.testing.assert_allclose(inner[0].data, probs[0].data[1:-1], atol=1e-6)


def test_masked_lm_folder_loads_backbone(tmp_path):
    """ModernBertForMaskedLM: the encoder sits under `model.`; hidden states still match."""
    import transformers

    folder = tmp_path / "mlm"
    build_modernbert(folder, "ModernBertForMaskedLM", seed=3)
    encoder = transformers.ModernBertModel.from_pretrained(folder).eval()
    lengths, ref = _reference(encoder, folder)
    outputs = Engine(str(folder), device="cpu").token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, outputs)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL)


def test_bad_rope_type_is_a_clear_error(tmp_path):
    folder = tmp_path / "rope"
    build_modernbert(folder, "ModernBertModel")
    import json

    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"]["sliding_attention"] = {"rope_type": "yarn", "rope_theta": 1.0,
                                                      "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type"):
        Engine(str(folder), device="cpu")
