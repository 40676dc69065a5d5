"""classify: BERT / RoBERTa / XLM-R sequence classifiers and CrossEncoder folders against
transformers and sentence-transformers on seeded random tiny models, plus bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.tiny_task_models import save_bert_task_model, save_roberta_seq_model

TEXTS = ["a cat sat on the mat", "what is the capital of france", "hi",
         "the quick brown fox jumps over the lazy dog and keeps running far away"]
PAIRS = ["paris is the capital", "a dog", "hello there", "foxes are quick"]


@pytest.fixture(scope="module")
def bert_seq(tmp_path_factory):
    from pooler import Engine

    path = save_bert_task_model(tmp_path_factory.mktemp("bert_seq"), "seq", num_labels=3,
                                id2label={0: "neg", 1: "neu", 2: "pos"},
                                label2id={"neg": 0, "neu": 1, "pos": 2})
    return path, Engine(str(path))


def hf_logits(path, texts, pairs=None, cls_name="AutoModelForSequenceClassification"):
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    rows = []
    for i, text in enumerate(texts):  # one by one: no padding in the reference
        enc = tokenizer(text, pairs[i] if pairs else None, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(**enc).logits[0].numpy())
    return np.stack(rows)


def test_bert_classify_matches_transformers_single_and_batch(bert_seq):
    path, engine = bert_seq
    logits = hf_logits(path, TEXTS)
    expected = torch.tensor(logits).softmax(-1).numpy()
    [single] = engine.classify(TEXTS[1])
    np.testing.assert_allclose(single.probs, expected[1], atol=1e-5)
    outputs = engine.classify(TEXTS)
    np.testing.assert_allclose(np.stack([o.probs for o in outputs]), expected, atol=1e-5)
    for o, row in zip(outputs, expected):
        assert o.label == ["neg", "neu", "pos"][int(row.argmax())]
        assert o.score == pytest.approx(float(row.max()), abs=1e-6)
        assert [x["score"] for x in o.labels] == sorted((x["score"] for x in o.labels),
                                                        reverse=True)
        assert {x["label"] for x in o.labels} == {"neg", "neu", "pos"}
        assert o.num_tokens > 2
    raw = engine.classify(TEXTS, use_activation=False)
    np.testing.assert_allclose(np.stack([o.probs for o in raw]), logits, atol=1e-5)


def test_bert_sentence_pairs_use_token_types(bert_seq):
    path, engine = bert_seq
    expected = torch.tensor(hf_logits(path, TEXTS, PAIRS)).softmax(-1).numpy()
    outputs = engine.classify(TEXTS, text_pair=PAIRS)
    np.testing.assert_allclose(np.stack([o.probs for o in outputs]), expected, atol=1e-5)
    # the pair really changes the result
    assert not np.allclose(outputs[0].probs, engine.classify(TEXTS[0])[0].probs, atol=1e-4)
    [one] = engine.classify(TEXTS[0], text_pair=PAIRS[0])
    np.testing.assert_allclose(one.probs, expected[0], atol=1e-5)


@pytest.mark.parametrize("xlm", [False, True])
def test_roberta_family_pairs_match_transformers(tmp_path, xlm):
    from pooler import Engine

    path = save_roberta_seq_model(tmp_path / "m", num_labels=2, xlm=xlm)
    engine = Engine(str(path))
    expected = torch.tensor(hf_logits(path, TEXTS, PAIRS)).softmax(-1).numpy()
    outputs = engine.classify(TEXTS, text_pair=PAIRS)
    np.testing.assert_allclose(np.stack([o.probs for o in outputs]), expected, atol=1e-5)


def test_cross_encoder_folder_matches_sentence_transformers(tmp_path):
    from sentence_transformers import CrossEncoder

    from pooler import Engine

    base = save_bert_task_model(tmp_path / "base", "seq", num_labels=1)
    for name, activation in (("sigmoid", None), ("identity", torch.nn.Identity())):
        folder = tmp_path / name
        model = CrossEncoder(str(base), activation_fn=activation, device="cpu")
        model.save(str(folder))
        expected = model.predict(list(zip(TEXTS, PAIRS)))
        engine = Engine(str(folder))
        got = [o.score for o in engine.classify(TEXTS, text_pair=PAIRS)]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert not np.all((np.array(got) > 0) & (np.array(got) < 1))  # identity: raw logits


def test_regression_problem_type_returns_logits(tmp_path):
    from pooler import Engine

    path = save_bert_task_model(tmp_path / "m", "seq", num_labels=1, problem_type="regression")
    engine = Engine(str(path))
    np.testing.assert_allclose([o.score for o in engine.classify(TEXTS)],
                               hf_logits(path, TEXTS)[:, 0], atol=1e-5)


def test_multi_label_problem_type_uses_sigmoid(tmp_path):
    from pooler import Engine

    path = save_bert_task_model(tmp_path / "m", "seq", num_labels=3,
                                problem_type="multi_label_classification")
    expected = torch.tensor(hf_logits(path, TEXTS)).sigmoid().numpy()
    got = np.stack([o.probs for o in Engine(str(path)).classify(TEXTS)])
    np.testing.assert_allclose(got, expected, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------------
def test_bad_input_errors_name_problem_and_fix(bert_seq):
    from pooler import Engine, PoolingParams

    path, engine = bert_seq
    with pytest.raises(ValueError, match="Unknown task: 'rerank'"):
        Engine(str(path), task="rerank")
    with pytest.raises(ValueError, match="Unknown task"):
        engine.encode("x", PoolingParams(task="bogus"))
    with pytest.raises(ValueError, match=r"Unsupported task: 'embed'. Supported tasks: "
                                         r"\['classify'\]"):
        engine.embed("a sentence")
    with pytest.raises(ValueError, match="is empty"):
        engine.classify([])
    with pytest.raises(ValueError, match="truncate=True"):
        engine.classify(" ".join(["word"] * 300), truncate=False)
    with pytest.raises(ValueError, match="one text_pair per input"):
        engine.classify(TEXTS, text_pair=PAIRS[:2])
    with pytest.raises(ValueError, match="not token ids"):
        engine.classify([[101, 2000, 102]], text_pair=["x"])
    # over-long input with truncation (the default) works
    assert engine.classify(" ".join(["word"] * 300))[0].num_tokens == 128


def test_pair_to_a_model_without_token_types_is_rejected(tmp_path):
    from pooler import Engine

    path = save_bert_task_model(tmp_path / "m", "seq", num_labels=2, type_vocab_size=1)
    engine = Engine(str(path))
    with pytest.raises(ValueError, match="does not take sentence pairs.*type_vocab_size=1"):
        engine.classify("a", text_pair="b")
    assert len(engine.classify("a")) == 1


def test_one_bad_request_does_not_break_the_batch(bert_seq):
    """A request that fails inside the model (token id past the embedding table, which only
    a buggy caller can send past the input checks) fails alone; the scheduler's bisection
    lets every other request of the batch finish with the right result."""
    from pooler import PoolingParams
    from pooler.engine.request import Request

    path, engine = bert_seq
    good = engine.classify(TEXTS)
    params = engine.verify_params(PoolingParams(task="classify"))
    encoded = engine.tokenizer.encode_batch(TEXTS)
    ids = [e.input_ids for e in encoded]
    ids.insert(2, [101, 10 ** 6, 102])  # out of the vocabulary
    for i, token_ids in enumerate(ids):
        engine.core.add_request(Request(f"mix-{i}", token_ids, params.clone()))
    results = {}
    while len(results) < len(ids):
        for out in engine.core.step():
            results[out.request_id] = out
    assert results["mix-2"].error and "index" in results["mix-2"].error.lower()
    ok = [results[f"mix-{i}"] for i in (0, 1, 3, 4)]
    assert all(r.error is None for r in ok)
    np.testing.assert_allclose(np.stack([r.data.numpy() for r in ok]),
                               np.stack([o.probs for o in good]), atol=1e-6)
