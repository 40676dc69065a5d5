"""NER aggregation on hand-made scores (the parity with the transformers pipeline on a real
model is in tests/models/test_ner_parity.py)."""
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

from pooler.ner import SubwordRules, extract_entities

LABELS = ["O", "B-PER", "I-PER", "S-LOC", "E-PER"]


@pytest.fixture(scope="module")
def rules():
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "jo": 3, "##hn": 4, "lives": 5, "in": 6,
             "rome": 7, "smith": 8}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return SubwordRules(tok)


TEXT = "john smith lives in rome"
IDS = [1, 3, 4, 8, 5, 6, 7, 2]
OFFSETS = [(0, 0), (0, 2), (2, 4), (5, 10), (11, 16), (17, 19), (20, 24), (0, 0)]
SPECIAL = [1, 0, 0, 0, 0, 0, 0, 1]


def one_hot(rows, p=0.9):
    out = np.full((len(rows), len(LABELS)), (1 - p) / (len(LABELS) - 1), dtype=np.float32)
    for i, label in enumerate(rows):
        out[i, LABELS.index(label)] = p
    return out


def run(rules, tags, **kwargs):
    scores = one_hot(["O"] + tags + ["O"])
    return extract_entities(TEXT, IDS, scores, OFFSETS, SPECIAL, LABELS, rules, **kwargs)


def test_simple_merges_bio_and_keeps_offsets(rules):
    entities = run(rules, ["B-PER", "I-PER", "I-PER", "O", "O", "S-LOC"])
    assert [(e.entity_group, e.start, e.end, e.word) for e in entities] == [
        ("PER", 0, 10, "john smith"), ("LOC", 20, 24, "rome")]
    assert entities[0].score == pytest.approx(0.9)


def test_bioes_end_tag_continues_and_single_tag_starts(rules):
    entities = run(rules, ["B-PER", "I-PER", "E-PER", "O", "O", "S-LOC"])
    assert [(e.entity_group, TEXT[e.start:e.end]) for e in entities] == [
        ("PER", "john smith"), ("LOC", "rome")]


def test_none_strategy_reports_tokens_with_index(rules):
    entities = run(rules, ["B-PER", "I-PER", "O", "O", "O", "O"], aggregation_strategy="none")
    assert [(e.entity, e.index, e.word) for e in entities] == [("B-PER", 1, "jo"),
                                                               ("I-PER", 2, "##hn")]


def test_word_strategies_make_words_agree(rules):
    # "jo" says B-PER, its continuation "##hn" says O: first keeps the word whole as PER.
    tags = ["B-PER", "O", "O", "O", "O", "O"]
    first = run(rules, tags, aggregation_strategy="first")
    assert [(e.entity_group, e.word, e.start, e.end) for e in first] == [("PER", "john", 0, 4)]
    simple = run(rules, tags, aggregation_strategy="simple")
    assert [(e.entity_group, e.end) for e in simple] == [("PER", 2)]


def test_ignore_subwords(rules):
    tags = ["B-PER", "O", "O", "O", "O", "O"]
    kept = run(rules, tags, aggregation_strategy="none", ignore_subwords=True,
               ignore_labels=())
    assert 2 not in [e.index for e in kept]  # "##hn" dropped
    assert [(e.entity_group, e.end) for e in run(rules, tags, ignore_subwords=True)] == [
        ("PER", 4)]  # simple + ignore_subwords labels the word by its first token
    with pytest.raises(ValueError, match="ignore_subwords"):
        run(rules, tags, aggregation_strategy="average", ignore_subwords=True)


def test_ignore_labels_and_bad_strategy(rules):
    tags = ["B-PER", "I-PER", "I-PER", "O", "O", "S-LOC"]
    assert [e.entity_group for e in run(rules, tags, ignore_labels=("O", "LOC"))] == ["PER"]
    with pytest.raises(ValueError, match="aggregation_strategy must be one of"):
        run(rules, tags, aggregation_strategy="longest")
