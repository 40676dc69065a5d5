"""token_classify and NER on the real PII model in ../shared/models/ner-pii-minilm, against
AutoModelForTokenClassification and the transformers token-classification pipeline."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

_ROOT = Path(__file__).resolve().parents[2]
# ../shared beside the checkout (a git worktree sits one level deeper, hence the second look).
MODEL = next((p for p in (_ROOT / ".." / "shared" / "models" / "ner-pii-minilm",
                          _ROOT / ".." / ".." / "shared" / "models" / "ner-pii-minilm")
              if (p / "config.json").is_file()), _ROOT / ".." / "shared" / "models" / "none")
pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(),
                                reason="../shared/models/ner-pii-minilm is absent")

FIRST = ["John", "Maria", "Wei", "Aisha", "Olivier", "Priya", "Jonathan", "Sven", "Fatima",
         "Kenji", "Isabella", "Dmitri"]
LAST = ["Smith", "Garcia", "Zhang", "Okafor", "Dubois", "Raman", "Whitfield", "Lindqvist",
        "Haddad", "Watanabe", "Rossi", "Petrov"]
STREETS = ["Market Street", "Baker St", "Elm Avenue", "Sunset Blvd", "Maple Drive",
           "Riverside Road"]
CITIES = [("San Francisco", "CA", "94103"), ("Springfield", "IL", "62704"),
          ("Austin", "TX", "73301"), ("Portland", "OR", "97205"), ("Boston", "MA", "02108")]
DOMAINS = ["example.com", "mail.org", "corp.net", "gmail.com"]
TEMPLATES = [
    "My name is {first} {last} and you can reach me at {email}.",
    "Please call {first} at {phone} before Friday.",
    "Ship it to {number} {street}, {city}, {state} {zip}.",
    "{first} {last} lives at {number} {street} in {city}.",
    "Contact: {email} / {phone}",
    "Hi, this is {first}. My number changed to {phone}, email {email}.",
    "The invoice for {last}, {first} goes to {number} {street}, Apt {apt}, {city} {zip}.",
    "no personal data in this sentence at all",
]


def generate_texts(n: int = 60, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        city, state, zip_code = rng.choice(CITIES)
        fields = dict(
            first=first, last=last, city=city, state=state, zip=zip_code,
            email=f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}",
            phone=rng.choice([f"({rng.randint(200, 999)}) {rng.randint(200, 999)}-"
                              f"{rng.randint(1000, 9999)}",
                              f"+1 {rng.randint(200, 999)} {rng.randint(200, 999)} "
                              f"{rng.randint(1000, 9999)}"]),
            number=rng.randint(1, 9999), street=rng.choice(STREETS), apt=rng.randint(1, 40))
        texts.append(TEMPLATES[i % len(TEMPLATES)].format(**fields))
    return texts


@pytest.fixture(scope="module")
def engine():
    from pooler import Engine

    return Engine(str(MODEL))


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    model = AutoModelForTokenClassification.from_pretrained(MODEL).eval()
    return model, AutoTokenizer.from_pretrained(MODEL)


def reference_probs(reference, text: str) -> np.ndarray:
    model, tokenizer = reference
    with torch.no_grad():
        logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
    return logits.softmax(-1).numpy()


def test_token_classify_single_request_matches_transformers(engine, reference):
    text = "My name is Jonathan Whitfield, email jon.whitfield@example.com."
    [out] = engine.token_classify(text)
    expected = reference_probs(reference, text)
    assert out.probs.shape == expected.shape == (out.num_tokens, 35)
    np.testing.assert_allclose(out.probs, expected, atol=1e-4, rtol=0)
    assert out.labels == [engine.model_config.id2label[i] for i in expected.argmax(-1)]
    assert out.token_ids == reference[1](text)["input_ids"]


def test_token_classify_mixed_length_batch_matches_transformers(engine, reference):
    texts = generate_texts(8, seed=7)
    texts[3] = "Hi"  # very short next to long ones
    outputs = engine.token_classify(texts)
    lengths = {o.num_tokens for o in outputs}
    assert len(lengths) > 3
    for text, out in zip(texts, outputs):
        np.testing.assert_allclose(out.probs, reference_probs(reference, text), atol=1e-4,
                                   rtol=0)


def test_skip_special_tokens_aligns_ids_and_probs(engine):
    [full] = engine.token_classify("call 555-0199")
    [kept] = engine.token_classify("call 555-0199", skip_special_tokens=True)
    assert kept.probs.shape[0] == full.probs.shape[0] - 2 == len(kept.token_ids)
    np.testing.assert_allclose(kept.probs, full.probs[1:-1], atol=1e-6)
    assert kept.token_ids == full.token_ids[1:-1]


def test_raw_logits_on_request(engine, reference):
    text = "Email maria@mail.org"
    [out] = engine.token_classify(text, use_activation=False)
    model, tokenizer = reference
    with torch.no_grad():
        logits = model(**tokenizer(text, return_tensors="pt")).logits[0].numpy()
    np.testing.assert_allclose(out.probs, logits, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def pipeline_runs():
    """The transformers pipeline's forward outputs for every text, computed once; each
    strategy then runs the pipeline's own postprocess on them."""
    from transformers import pipeline

    texts = generate_texts(50)
    ner = pipeline("token-classification", model=str(MODEL), device="cpu")
    runs = [[ner.forward(inputs) for inputs in ner.preprocess(text, is_split_into_words=False)]
            for text in texts]
    return texts, ner, runs


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "max", "average"])
def test_entities_equal_transformers_pipeline(engine, pipeline_runs, strategy):
    from transformers.pipelines.token_classification import AggregationStrategy

    texts, ner, runs = pipeline_runs
    expected = [ner.postprocess(run, aggregation_strategy=AggregationStrategy[strategy.upper()])
                for run in runs]
    ours = engine.ner(texts, aggregation_strategy=strategy)
    assert len(texts) >= 50
    assert sum(len(e) for e in expected) > 100  # the texts really contain entities
    key = "entity" if strategy == "none" else "entity_group"
    for text, got, want in zip(texts, ours, expected):
        assert [(e.label, e.start, e.end, e.word) for e in got] == \
            [(w[key], w["start"], w["end"], w["word"]) for w in want], text
        np.testing.assert_allclose([e.score for e in got], [float(w["score"]) for w in want],
                                   atol=1e-4)
        if strategy == "none":
            assert [e.index for e in got] == [w["index"] for w in want]


def test_pipeline_shortcut_equals_calling_the_pipeline(pipeline_runs):
    """The shared forward above is the pipeline's own: same result as calling it."""
    texts, ner, runs = pipeline_runs
    direct = ner(texts[:3], aggregation_strategy="simple")
    from transformers.pipelines.token_classification import AggregationStrategy

    shared = [ner.postprocess(run, aggregation_strategy=AggregationStrategy.SIMPLE)
              for run in runs[:3]]
    assert [[(e["entity_group"], e["start"], e["end"]) for e in d] for d in direct] == \
        [[(e["entity_group"], e["start"], e["end"]) for e in s] for s in shared]


def test_ignore_labels_and_subwords(engine):
    text = "Jonathan Whitfield lives at 12 Baker St, Boston."
    everything = engine.ner(text, ignore_labels=())[0]
    assert any(e.label == "O" for e in everything)
    no_city = engine.ner(text, ignore_labels=("O", "CITY"))[0]
    assert all(e.label not in ("O", "CITY") for e in no_city)
    tokens = engine.ner(text, aggregation_strategy="none", ignore_labels=())[0]
    heads = engine.ner(text, aggregation_strategy="none", ignore_labels=(),
                       ignore_subwords=True)[0]
    assert len(heads) < len(tokens)
    assert all(not e.word.startswith("##") for e in heads)
    # "simple" with ignore_subwords labels each word by its first token: same as "first"
    first = engine.ner(text, aggregation_strategy="first")[0]
    assert engine.ner(text, ignore_subwords=True)[0] == first


def test_ner_needs_texts(engine):
    with pytest.raises(ValueError, match="ner needs texts"):
        engine.ner([[2, 100, 3]])
