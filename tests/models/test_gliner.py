"""GLiNER span models (zero-shot NER) against the `gliner` package (0.2.29) on seeded random tiny
models it saved itself: the same span x label probabilities (fp32, atol 1e-5) and the same
entities (text, label, start, end; scores to 1e-5) for single texts and mixed-length batches,
flat and nested, shared and per-text label sets, texts longer than max_len words and sequences
longer than the tokenizer's limit; plus the errors a user meets."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from pooler.engine.llm import Engine
from pooler.gliner import split_words
from tests.models.gliner_folders import LABELS, TEXTS, build_gliner

gliner = pytest.importorskip("gliner")

ATOL = 1e-5
# default: projection (48 != 32), first sub-token, <<ENT>> vectors, bi-LSTM, torch .bin;
# variant: no projection, last sub-token, label-token vectors, no LSTM, safetensors. The parity
# tests run on both; the error, CLI and limit tests on the default one.
VARIANTS = {
    "default": {},
    "variant": dict(hidden_size=32, subtoken_pooling="last", embed_ent_token=False,
                    num_rnn_layers=0, max_width=3, safetensors=True),
}
LONG_TEXT = " ".join(["the quick brown fox jumps over the lazy dog"] * 5)  # 45 words


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def models(request, tmp_path_factory):
    folder = build_gliner(tmp_path_factory.mktemp(request.param) / "gliner",
                          **VARIANTS[request.param])
    reference = gliner.GLiNER.from_pretrained(str(folder), local_files_only=True)
    return request.param, folder, reference, Engine(str(folder), device="cpu")


def _reference_probs(reference, texts, labels):
    """gliner's own batch: sigmoid of its [B, words, max_width, labels] logits."""
    prepared = reference.prepare_batch(texts, labels)
    batch = reference.collate_batch(prepared["input_x"], prepared["entity_types"],
                                    reference.create_collator())
    logits = reference.run_batch(batch).logits
    max_len = reference.config.max_len  # gliner cuts texts to max_len words in the collator
    return torch.sigmoid(logits).numpy(), [min(len(t), max_len) for t in prepared["tokens"]]


def _entities(reference_out):
    return [(e["start"], e["end"], e["label"], e["text"]) for e in reference_out]


def _ours(entities):
    return [(e.start, e.end, e.label, e.word) for e in entities]


def _assert_same(ours, theirs, where=""):
    assert _ours(ours) == _entities(theirs), where
    np.testing.assert_allclose([e.score for e in ours], [e["score"] for e in theirs],
                               atol=ATOL, err_msg=where)


def test_span_probabilities_match_gliner(models):
    name, _, reference, engine = models
    label_sets = [LABELS, ["city"], LABELS[::-1] + ["person"], ["animal", "city"], LABELS]
    expected, num_words = _reference_probs(reference, TEXTS, label_sets)
    todo, built, results = engine.gliner_span_scores(TEXTS, label_sets)
    assert todo == list(range(len(TEXTS)))
    max_width = reference.config.max_width
    for i, (item, result) in enumerate(zip(built, results)):
        probs = result.data.numpy()  # [num_words, max_width, num_labels]
        assert probs.shape == (num_words[i], max_width, len(label_sets[i]))
        for start in range(num_words[i]):
            widths = min(max_width, num_words[i] - start)  # spans inside the text
            np.testing.assert_allclose(probs[start, :widths],
                                       expected[i, start, :widths, :len(label_sets[i])],
                                       atol=ATOL, err_msg=f"{name}, text {i}, start {start}")
            assert not probs[start, widths:].any()  # spans past the end score 0


@pytest.mark.parametrize("flat_ner", [True, False])
def test_entities_match_predict_entities(models, flat_ner):
    name, _, reference, engine = models
    found = 0
    for threshold in (0.2, 0.5):
        for text in TEXTS:
            theirs = reference.predict_entities(text, LABELS, threshold=threshold,
                                                flat_ner=flat_ner)
            ours = engine.ner(text, labels=LABELS, threshold=threshold, flat_ner=flat_ner)[0]
            _assert_same(ours, theirs, f"{name} {text!r} t={threshold}")
            found += len(ours)
    assert found > 10  # the comparison saw entities, not only empty lists


@pytest.mark.parametrize("flat_ner,multi_label", [(True, False), (False, False), (False, True)])
def test_mixed_batch_and_per_text_labels(models, flat_ner, multi_label):
    name, _, reference, engine = models
    texts = TEXTS + ["", "   ", LONG_TEXT]
    label_sets = [LABELS, ["city", "city", "animal"], ["person"], ["animal", "city"], LABELS,
                  ["city"], LABELS, ["animal", "thing"]]
    theirs = reference.inference(texts, label_sets, threshold=0.15, flat_ner=flat_ner,
                                 multi_label=multi_label, batch_size=3)
    ours = engine.ner(texts, labels=label_sets, threshold=0.15, flat_ner=flat_ner,
                      multi_label=multi_label)
    assert ours[5] == ours[6] == []  # no word, no span (gliner returns none either)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _assert_same(a, b, f"{name} text {i}")
    shared = reference.inference(texts, LABELS, threshold=0.3, flat_ner=flat_ner)
    for i, (a, b) in enumerate(zip(engine.ner(texts, labels=LABELS, threshold=0.3,
                                               flat_ner=flat_ner), shared)):
        _assert_same(a, b, f"{name} shared labels, text {i}")
    if not flat_ner:  # nested decoding really kept an entity inside another
        spans = [(e.start, e.end) for ents in ours for e in ents]
        assert any(a[0] <= b[0] and b[1] <= a[1] and a != b for a in spans for b in spans)


def test_text_longer_than_max_len_words(models):
    """gliner reads max_len (20) words: no entity may come from the words after them."""
    name, _, reference, engine = models
    theirs = reference.predict_entities(LONG_TEXT, LABELS, threshold=0.1)
    ours = engine.ner(LONG_TEXT, labels=LABELS, threshold=0.1)[0]
    _assert_same(ours, theirs, name)
    twentieth_word_end = split_words(LONG_TEXT)[19][2]
    assert ours and max(e.end for e in ours) <= twentieth_word_end


@pytest.mark.parametrize("models", ["default"], indirect=True)
def test_sequence_longer_than_the_tokenizer_limit(models, tmp_path):
    """With max_len raised to 200 words, a long text takes more than the tokenizer's 128
    tokens: both cut the tokens there, and the words left without a token score from a zero
    vector (through the LSTM), in gliner and here alike."""
    name, folder, _, _ = models
    copy = tmp_path / "gliner"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "gliner_config.json").read_text())
    config["max_len"] = 200
    (copy / "gliner_config.json").write_text(json.dumps(config))
    reference = gliner.GLiNER.from_pretrained(str(copy), local_files_only=True)
    engine = Engine(str(copy), device="cpu")
    text = LONG_TEXT + " " + TEXTS[3]
    assert engine.model_config.max_model_len == 128
    assert len(engine.gliner_inputs.build([text], [LABELS])[0].processed.prompt_token_ids) == 128
    expected, num_words = _reference_probs(reference, [text], LABELS)
    _, built, results = engine.gliner_span_scores([text], [LABELS])
    probs = results[0].data.numpy()
    assert probs.shape[0] == num_words[0] == len(split_words(text)) > 60
    for start in range(num_words[0] - reference.config.max_width + 1):
        np.testing.assert_allclose(probs[start], expected[0, start], atol=ATOL,
                                   err_msg=f"{name}, start {start}")
    _assert_same(engine.ner(text, labels=LABELS, threshold=0.2)[0],
                 reference.predict_entities(text, LABELS, threshold=0.2), name)


@pytest.mark.parametrize("models", ["default"], indirect=True)
def test_batch_invariance_with_other_requests(models):
    """A GLiNER request packed with others gives what it gives alone."""
    _, _, _, engine = models
    alone = [engine.ner(t, labels=LABELS, threshold=0.2)[0] for t in TEXTS]
    together = engine.ner(TEXTS, labels=LABELS, threshold=0.2)
    for a, b in zip(alone, together):
        assert _ours(a) == _ours(b)
        np.testing.assert_allclose([e.score for e in a], [e.score for e in b], atol=1e-6)


@pytest.mark.parametrize("models", ["default"], indirect=True)
def test_gliner_request_errors(models):
    _, _, _, engine = models
    with pytest.raises(ValueError, match="labels is required"):
        engine.ner("paris is the capital of france")
    for bad in ([], "city", [""], ["city", 3], [["city"], ["animal"]]):
        with pytest.raises(ValueError, match="labels"):
            engine.ner(["paris"], labels=bad)
    for bad in (0, 0.0, -0.1, 1.5, "0.5", True):
        with pytest.raises(ValueError, match="threshold"):
            engine.ner("paris", labels=["city"], threshold=bad)
    with pytest.raises(ValueError, match="aggregation_strategy"):
        engine.ner("paris", labels=["city"], aggregation_strategy="first")
    with pytest.raises(ValueError, match="GLiNER model"):
        engine.token_classify("paris")
    with pytest.raises(ValueError, match="Unsupported task"):
        engine.embed("paris")
    assert engine.ner("paris", labels=["city"], threshold=1.0) == [[]]


def test_labels_refused_on_a_token_classification_model(tmp_path):
    from tests.models.tiny_task_models import save_bert_task_model

    folder = save_bert_task_model(tmp_path / "token", "token")
    engine = Engine(str(folder), device="cpu")
    with pytest.raises(ValueError, match="labels.*GLiNER"):
        engine.ner("paris is nice", labels=["city"])
    with pytest.raises(ValueError, match="threshold.*GLiNER"):
        engine.ner("paris is nice", threshold=0.4)


@pytest.mark.parametrize("models", ["default"], indirect=True)
@pytest.mark.parametrize("change,message", [
    ({"span_mode": "token_level"}, "token-level"),
    ({"labels_encoder": "some/encoder"}, "bi-encoder"),
    ({"span_mode": "markerV1"}, "span_mode 'markerV1'"),
    ({"post_fusion_schema": "l2l-l2t"}, "post_fusion_schema"),
    ({"subtoken_pooling": "mean"}, "subtoken_pooling 'mean'"),
    ({"encoder_config": {"model_type": "bert"}}, "backbone model_type 'bert'"),
])
def test_unsupported_gliner_variants_are_named(models, tmp_path, change, message):
    _, folder, _, _ = models
    copy = tmp_path / "gliner"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "gliner_config.json").read_text())
    config.update(change)
    (copy / "gliner_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message) as info:
        Engine(str(copy), device="cpu")
    assert "markerV0" in str(info.value)  # says what is supported


@pytest.mark.parametrize("models", ["default"], indirect=True)
def test_ner_cli_with_labels(models, capsys):
    from pooler.cli.main import main

    name, folder, _, engine = models
    text = TEXTS[4]
    code = main(["ner", "--model", str(folder), "--labels", "animal,city", "--labels",
                 "capital of a country", "--threshold", "0.1", "--nested", text])
    out = capsys.readouterr()
    assert code == 0, out.err
    [record] = [json.loads(line) for line in out.out.splitlines()]
    expected = engine.ner(text, labels=LABELS, threshold=0.1,
                          flat_ner=False)[0]
    assert [(e["entity_group"], e["start"], e["end"], e["text"]) for e in record["entities"]] \
        == [(e.label, e.start, e.end, e.word) for e in expected] and expected
    assert main(["ner", "--model", str(folder), text]) == 2
    assert "labels is required" in capsys.readouterr().err


@pytest.mark.parametrize("models", ["default"], indirect=True)
def test_batch_job_with_labels(models, tmp_path):
    """`pooler batch --task ner --labels ...`: the Parquet entities equal Engine.ner's."""
    pq = pytest.importorskip("pyarrow.parquet")
    from pooler.cli.main import main

    _, folder, _, engine = models
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "out"
    assert main(["batch", "--model", str(folder), "--task", "ner", "--input", str(source),
                 "--output", str(out), "--labels", "animal,city", "--labels",
                 "capital of a country", "--threshold", "0.2", "--nested",
                 "--no-progress"]) == 0
    rows = pq.read_table(out).to_pylist()
    expected = engine.ner(TEXTS, labels=LABELS, threshold=0.2, flat_ner=False)
    assert sum(len(e) for e in expected) > 5
    for row, want in zip(rows, expected):
        assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in row["entities"]] \
            == [(e.label, e.word, e.start, e.end) for e in want]
        np.testing.assert_allclose([e["score"] for e in row["entities"]],
                                   [e.score for e in want], atol=1e-6)
    with pytest.raises(ValueError, match="--labels applies to --task ner"):
        from pooler.batch.columns import TaskOptions
        TaskOptions(task="embed", labels=["city"])
