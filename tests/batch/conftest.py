"""Tiny seeded models (saved with save_pretrained, MiniLM's tokenizer) and small corpora for the
corpus-job tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models.tiny import add_st_pooling, save_tiny_bert
from tests.models.tiny_task_models import save_bert_task_model

pytest.importorskip("pyarrow")

WORDS = ("the quick brown fox jumps over a lazy dog while pooler embeds every passage of "
         "the corpus in paris berlin and tokyo").split()


def corpus_texts(n: int, seed: int = 0) -> list[str]:
    """n short generated texts of 3 to 20 words."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) for _ in range(n)]


@pytest.fixture(scope="session")
def tiny_embedder(tmp_path_factory, minilm_path) -> Path:
    folder = save_tiny_bert(tmp_path_factory.mktemp("tiny-embedder"), minilm_path, seed=3)
    add_st_pooling(folder, "mean", normalize=True)
    return folder


@pytest.fixture(scope="session")
def tiny_task_model(tmp_path_factory):
    """kind -> folder: 'seq' classifier, 'token' NER tagger, 'mlm' masked LM (SPLADE)."""
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            dest = tmp_path_factory.mktemp(f"tiny-{kind}")
            if kind == "mlm":
                from tests.models.tiny_task_models import minilm_path
                made[kind] = save_tiny_bert(dest, minilm_path(), seed=5,
                                            architecture="BertForMaskedLM")
            elif kind == "token":
                labels = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
                made[kind] = save_bert_task_model(dest, "token", num_labels=5, seed=7,
                                                  id2label=labels,
                                                  label2id={v: k for k, v in labels.items()})
            else:
                made[kind] = save_bert_task_model(dest, "seq", num_labels=3, seed=6)
        return made[kind]
    return get


def write_jsonl(path: Path, records: list) -> Path:
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path
