"""Fixtures: a real uvicorn server on a free loopback port, in a thread, serving an Engine.

One MiniLM engine is shared by several apps (default limits, tight limits, API key); each app
leaves the engine's loop running at its shutdown and the session fixture stops it at the end.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from pathlib import Path

import httpx
import pytest

from tests.server.health import wait_until_healthy

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_MODELS = Path(__file__).resolve().parents[2] / ".." / "shared" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(engine, settings=None, owns_engine: bool = False):
    """Run create_app(engine, settings) under uvicorn in a thread; yield (base_url, app)."""
    import uvicorn

    from pooler.server.app import create_app

    app = create_app(engine, settings, owns_engine=owns_engine)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, 60, thread.is_alive)
        yield url, app
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def engine(minilm_path):
    from pooler import Engine

    engine = Engine(str(minilm_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def server(engine):
    with serve(engine) as (url, app):
        yield url, app


@pytest.fixture(scope="session")
def url(server) -> str:
    return server[0]


@pytest.fixture(scope="session")
def client(url):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def shared_model(name: str) -> Path:
    path = SHARED_MODELS / name
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} is absent (../shared is only in the workspace)")
    return path.resolve()


def tiny_bert_folder(tmp: Path, minilm_path: Path, head: str, num_labels: int,
                     id2label: dict[int, str] | None = None) -> Path:
    """A seeded random 2-layer BERT with a classification head, saved with save_pretrained,
    plus all-MiniLM-L6-v2's tokenizer files (its vocabulary size)."""
    import torch
    import transformers

    torch.manual_seed(0)
    labels = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=512, num_labels=num_labels,
        id2label=labels, label2id={v: k for k, v in labels.items()})
    model = getattr(transformers, head)(config).eval()
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (minilm_path / name).is_file():
            shutil.copy(minilm_path / name, tmp / name)
    return tmp


@pytest.fixture(scope="session")
def serve_app():
    """The `serve` context manager, for tests that need their own settings or engine."""
    return serve


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_bert_folder


@pytest.fixture(scope="session")
def shared_model_path():
    return shared_model


# Tiny seeded task models behind real servers, one of each kind for the whole session (the
# modules that test routes against them only read): (base_url, engine, app).
SENTIMENT_LABELS = {0: "negative", 1: "neutral", 2: "positive"}
NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def _served_tiny(tmp_path_factory, minilm_path, name, head, num_labels, labels=None):
    from pooler import Engine

    folder = tiny_bert_folder(tmp_path_factory.mktemp(name), minilm_path, head, num_labels,
                              labels)
    return serve(Engine(str(folder)), owns_engine=True)


@pytest.fixture(scope="session")
def classifier_server(tmp_path_factory, minilm_path):
    """A 3-label sequence classifier (negative / neutral / positive)."""
    with _served_tiny(tmp_path_factory, minilm_path, "cls", "BertForSequenceClassification",
                      3, SENTIMENT_LABELS) as (url, app):
        yield url, app.state.pooler.engine, app


@pytest.fixture(scope="session")
def cross_encoder_server(tmp_path_factory, minilm_path):
    """A 1-label sequence classifier: a cross-encoder (reranker)."""
    with _served_tiny(tmp_path_factory, minilm_path, "ce", "BertForSequenceClassification",
                      1) as (url, app):
        yield url, app.state.pooler.engine, app


@pytest.fixture(scope="session")
def token_classifier_server(tmp_path_factory, minilm_path):
    """A BIO token classifier (PER, LOC)."""
    with _served_tiny(tmp_path_factory, minilm_path, "ner", "BertForTokenClassification", 5,
                      NER_LABELS) as (url, app):
        yield url, app.state.pooler.engine, app
