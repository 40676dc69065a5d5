"""DeBERTa-v3, DeBERTa-v2 and DeBERTa (v1) parity with transformers 5.3 on seeded random tiny
models saved with save_pretrained (fp32, atol 1e-5), single inputs and mixed-length batches.

The texts run from 5 to ~100 tokens against position_buckets=8 / max_relative_positions<=24,
so the log buckets and the clamp at the relative table's edge are both on the path.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pooler.engine.llm import Engine
from pooler.params import PoolingParams
from tests.models.deberta_folders import TEXTS, V1, V2, V3, build_deberta

ATOL = 1e-5
STYLES = {"v3": ("DebertaV2", V3), "v2": ("DebertaV2", V2), "v1": ("Deberta", V1)}


def _reference(model, folder, texts=TEXTS, pairs=None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    batch = tok(texts, pairs, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    return batch["attention_mask"].sum(1).tolist(), out


@pytest.fixture(scope="module", params=sorted(STYLES))
def base_folder(request, tmp_path_factory):
    prefix, style = STYLES[request.param]
    folder = tmp_path_factory.mktemp(f"deberta_{request.param}")
    return request.param, folder, build_deberta(folder, prefix + "Model", style=style)


def test_hidden_states_match_transformers(base_folder):
    name, folder, model = base_folder
    lengths, ref = _reference(model, folder)
    cfg = model.config
    assert max(lengths) > 2 * cfg.max_relative_positions, "the clamp must be reached"
    engine = Engine(str(folder), device="cpu")
    outputs = engine.token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, outputs)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL, err_msg=f"{name}, text {i}")
    cls = engine.embed(TEXTS, normalize=False)  # a plain folder pools [CLS]
    np.testing.assert_allclose(np.stack([o.embedding for o in cls]),
                               ref.last_hidden_state[:, 0].numpy(), atol=ATOL)


def test_single_equals_batched(base_folder):
    name, folder, model = base_folder
    engine = Engine(str(folder), device="cpu")
    batched = engine.token_embed(TEXTS, normalize=False)
    for text, out in zip(TEXTS, batched):
        alone = engine.token_embed(text, normalize=False)[0]
        np.testing.assert_allclose(alone.embeddings, out.embeddings, atol=ATOL)
        _, ref = _reference(model, folder, [text])  # unpadded reference for one input
        np.testing.assert_allclose(alone.embeddings, ref.last_hidden_state[0].numpy(), atol=ATOL)


def test_log_buckets_match_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from pooler.models.deberta import log_bucket_positions

    relative = torch.arange(-600, 601)
    for buckets, max_position in ((8, 24), (256, 512), (64, 128)):
        np.testing.assert_array_equal(
            log_bucket_positions(relative, buckets, max_position).numpy(),
            make_log_bucket_position(relative, buckets, max_position).long().numpy())


@pytest.mark.parametrize("pos_att_type", ["c2p", "p2c", ""])
def test_position_terms_alone(tmp_path, pos_att_type):
    """One of c2p / p2c, or none (content-only attention, still scaled by the reference's
    factor); a relative position setting that does nothing must still load its weights."""
    model = build_deberta(tmp_path, "DebertaV2Model", seed=4,
                          style={**V3, "pos_att_type": pos_att_type, "share_att_key": False})
    lengths, ref = _reference(model, tmp_path)
    outputs = Engine(str(tmp_path), device="cpu").token_embed(TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, outputs)):
        np.testing.assert_allclose(out.embeddings, ref.last_hidden_state[i, :n].numpy(),
                                   atol=ATOL)


def test_sentence_transformers_folder_mean_pooling(tmp_path):
    from sentence_transformers import SentenceTransformer, models

    build_deberta(tmp_path / "hf", "DebertaV2Model", seed=5)
    transformer = models.Transformer(str(tmp_path / "hf"))
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), "mean")
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    st.save(str(tmp_path / "st"))
    expected = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    engine = Engine(str(tmp_path / "st"), device="cpu")
    got = engine.embed(TEXTS)
    np.testing.assert_allclose(np.stack([o.embedding for o in got]), expected, atol=ATOL)
    np.testing.assert_allclose(engine.embed(TEXTS[3])[0].embedding, expected[3], atol=ATOL)


@pytest.mark.parametrize("style", ["v3", "v1"])
def test_nli_pairs_classify(tmp_path, style):
    """3-label NLI over (premise, hypothesis) pairs: ContextPooler (GELU) + classifier."""
    prefix, kwargs = STYLES[style]
    model = build_deberta(tmp_path, prefix + "ForSequenceClassification", seed=6, style=kwargs)
    hypotheses = ["a cat", "the fox is quick"] * 3
    _, ref = _reference(model, tmp_path, TEXTS, hypotheses)
    engine = Engine(str(tmp_path), device="cpu")
    assert engine.default_task == "classify"
    got = engine.classify(TEXTS, text_pair=hypotheses, use_activation=False)
    np.testing.assert_allclose(np.stack([o.probs for o in got]), ref.logits.numpy(), atol=ATOL)
    probs = engine.classify(TEXTS, text_pair=hypotheses)
    np.testing.assert_allclose(np.stack([o.probs for o in probs]),
                               torch.softmax(ref.logits, -1).numpy(), atol=ATOL)
    assert [o.label for o in probs] == [model.config.id2label[int(i)]
                                        for i in ref.logits.argmax(-1)]


def test_reranker_matches_cross_encoder(tmp_path):
    """An mxbai-rerank-v1 style folder: DebertaV2ForSequenceClassification with one label,
    saved by sentence-transformers CrossEncoder; score and rerank as CrossEncoder does."""
    from sentence_transformers import CrossEncoder

    build_deberta(tmp_path / "hf", "DebertaV2ForSequenceClassification", seed=7,
                  id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    CrossEncoder(str(tmp_path / "hf"), device="cpu").save(str(tmp_path / "ce"))
    reference = CrossEncoder(str(tmp_path / "ce"), device="cpu")
    query, docs = "where is paris", TEXTS
    engine = Engine(str(tmp_path / "ce"), device="cpu")
    expected = reference.predict([(query, d) for d in docs])
    np.testing.assert_allclose([o.score for o in engine.score(query, docs)], expected,
                               atol=ATOL)
    ranked = engine.rerank(query, docs, top_n=3)
    assert [r.index for r in ranked] == [e["corpus_id"] for e in
                                         reference.rank(query, docs, top_k=3)]


def test_token_classification(tmp_path):
    model = build_deberta(tmp_path, "DebertaV2ForTokenClassification", seed=8)
    lengths, ref = _reference(model, tmp_path)
    engine = Engine(str(tmp_path), device="cpu")
    assert engine.default_task == "token_classify"
    logits = engine.encode(TEXTS, PoolingParams(task="token_classify", use_activation=False))
    probs = engine.encode(TEXTS)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(logits[i].data, ref.logits[i, :n].numpy(), atol=ATOL)
        np.testing.assert_allclose(probs[i].data, torch.softmax(ref.logits[i, :n], -1).numpy(),
                                   atol=ATOL)
    inner = engine.token_classify(TEXTS[:1], skip_special_tokens=True)  # [CLS]/[SEP] dropped
    np.testing.assert_allclose(inner[0].probs, probs[0].data[1:-1], atol=1e-6)


def test_config_without_architectures_is_the_base_model(tmp_path):
    """Hub DeBERTa-v3 configs (microsoft/deberta-v3-base) name only model_type."""
    model = build_deberta(tmp_path, "DebertaV2Model", seed=9)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    lengths, ref = _reference(model, tmp_path, TEXTS[:2])
    out = Engine(str(tmp_path), device="cpu").token_embed(TEXTS[:2], normalize=False)
    np.testing.assert_allclose(out[1].embeddings, ref.last_hidden_state[1, :lengths[1]].numpy(),
                               atol=ATOL)


def test_bf16_runs_the_sdpa_path(tmp_path):
    """Half precision takes SDPA with the bias as a float mask: close to fp32, not equal."""
    model = build_deberta(tmp_path, "DebertaV2Model", seed=10)
    lengths, ref = _reference(model, tmp_path)
    outputs = Engine(str(tmp_path), device="cpu", dtype="bfloat16").token_embed(
        TEXTS, normalize=False)
    for i, (n, out) in enumerate(zip(lengths, outputs)):
        np.testing.assert_allclose(out.embeddings.astype(np.float32),
                                   ref.last_hidden_state[i, :n].numpy(), atol=0.15)


def test_unsupported_settings_are_clear_errors(tmp_path):
    build_deberta(tmp_path, "DebertaModel", seed=11, style=V1)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "talking_head": True}))
    with pytest.raises(ValueError, match="talking_head.*runner='transformers'"):
        Engine(str(tmp_path), device="cpu")
    (tmp_path / "config.json").write_text(json.dumps({**config, "pos_att_type": "p2p"}))
    with pytest.raises(ValueError, match="pos_att_type"):
        Engine(str(tmp_path), device="cpu")


def test_sentencepiece_only_folder_says_how_to_convert(tmp_path):
    build_deberta(tmp_path, "DebertaV2Model", seed=12)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "spm.model").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="SentencePiece.*save_pretrained"):
        Engine(str(tmp_path), device="cpu")


def test_int8_quantization_stays_close(tmp_path):
    """quantization='int8' swaps the FFN, output and position projections (v2's separate
    pos_key_proj / pos_query_proj included) for int8 layers; outputs stay close to fp32."""
    build_deberta(tmp_path, "DebertaV2Model", seed=13, style=V2)
    fp32 = Engine(str(tmp_path), device="cpu").embed(TEXTS)
    engine = Engine(str(tmp_path), device="cpu", quantization="int8",
                    precision_check="off")  # the layers, whatever this CPU times
    from pooler.layers.quantization import Int8Linear

    names = {n.rsplit(".", 1)[-1] for n, m in engine.core.model_runner.model.named_modules()
             if isinstance(m, Int8Linear)}
    assert {"pos_key_proj", "pos_query_proj", "up_proj", "down_proj"} <= names
    int8 = engine.embed(TEXTS)
    cos = [float(np.dot(a.embedding, b.embedding)) for a, b in zip(fp32, int8)]
    assert min(cos) > 0.99


NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "max", "average"])
def test_ner_equals_transformers_pipeline(tmp_path_factory, strategy):
    """A DeBERTa-v3 NER folder (SentencePiece-style Unigram tokenizer, '▁' word starts):
    entities, offsets and scores as the token-classification pipeline gives them."""
    from transformers import pipeline
    from transformers.pipelines.token_classification import AggregationStrategy

    folder = tmp_path_factory.getbasetemp() / "deberta_ner"
    if not (folder / "config.json").is_file():
        build_deberta(folder, "DebertaV2ForTokenClassification", seed=14, id2label=NER_LABELS,
                      label2id={v: k for k, v in NER_LABELS.items()}, initializer_range=0.2)
    ner = pipeline("token-classification", model=str(folder), device="cpu")
    expected = ner(TEXTS, aggregation_strategy=AggregationStrategy[strategy.upper()])
    got = Engine(str(folder), device="cpu").ner(TEXTS, aggregation_strategy=strategy)
    assert sum(len(e) for e in expected) > 5  # the random head does tag entities
    key = "entity" if strategy == "none" else "entity_group"
    for text, ours, want in zip(TEXTS, got, expected):
        assert [(e.label, e.start, e.end, e.word) for e in ours] == \
            [(w[key], w["start"], w["end"], w["word"]) for w in want], text
        np.testing.assert_allclose([e.score for e in ours], [float(w["score"]) for w in want],
                                   atol=ATOL)
