"""The ONNX Runtime and fastembed peers of `pooler bench` (pooler/bench/onnx_peer.py) on a
seeded tiny BERT saved as a sentence-transformers folder: the export computes what pooler
computes (fp32, 1e-5), the int8 export stays close, and a missing package is a skip line."""
from __future__ import annotations

import numpy as np
import pytest

from tests.models.tiny import add_st_pooling, save_tiny_bert

TEXTS = ["a short query", "The cat sat on the mat while the dog slept by the door.", "x",
         "mixed lengths in one batch: " + "token " * 30]
LONG = "word " * 400  # past the folder's max_seq_length (128): every side truncates there


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, minilm_path):
    folder = save_tiny_bert(tmp_path_factory.mktemp("onnx-peer") / "bert", minilm_path, seed=3)
    add_st_pooling(folder, "mean", normalize=True)
    return folder


@pytest.fixture(scope="module")
def export(tiny_folder, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from pooler.bench import onnx_peer

    mp = pytest.MonkeyPatch()
    mp.setenv("POOLER_BENCH_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        yield onnx_peer.export_folder(tiny_folder)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def pooler_vectors(tiny_folder):
    from pooler.engine.llm import Engine

    engine = Engine(str(tiny_folder))
    return np.stack([o.embedding for o in engine.embed(TEXTS + [LONG])])


def test_export_folder_holds_both_models_and_the_st_truncation(export):
    import json

    assert (export / "model.onnx").is_file() and (export / "model_int8.onnx").is_file()
    assert json.loads((export / "tokenizer_config.json").read_text())["model_max_length"] == 128


def test_ort_fp32_matches_pooler(export, tiny_folder, pooler_vectors):
    from pooler.bench.onnx_peer import FP32_FILE, OrtEmbedder

    ort = OrtEmbedder(tiny_folder, FP32_FILE, threads=1)
    batched = ort.encode(TEXTS + [LONG], batch_size=3)  # length-sorted, padded batches
    np.testing.assert_allclose(batched, pooler_vectors, atol=1e-5)
    single = ort.encode([TEXTS[0]])
    np.testing.assert_allclose(single[0], pooler_vectors[0], atol=1e-5)


def test_ort_int8_is_close_but_not_identical(export, tiny_folder, pooler_vectors):
    from pooler.bench.onnx_peer import INT8_FILE, OrtEmbedder

    vectors = OrtEmbedder(tiny_folder, INT8_FILE, threads=1).encode(TEXTS + [LONG])
    cosines = (vectors * pooler_vectors).sum(1)  # both sides are normalized
    assert cosines.min() > 0.9
    assert np.abs(vectors - pooler_vectors).max() > 1e-5  # it really is the quantized model


def test_fastembed_on_the_export_matches_pooler(export, tiny_folder, pooler_vectors):
    pytest.importorskip("fastembed")
    from pooler.bench.onnx_peer import FP32_FILE, fastembed_model

    model = fastembed_model(tiny_folder, FP32_FILE, threads=1)
    vectors = np.stack(list(model.embed(TEXTS + [LONG])))
    np.testing.assert_allclose(vectors, pooler_vectors, atol=1e-5)


def test_missing_package_is_a_skip_line(monkeypatch):
    import importlib.util

    from pooler.bench.registry import BenchOptions, get_workload

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    opts = BenchOptions(model="sentence-transformers/all-MiniLM-L6-v2", threads=1)
    for workload in ("embed", "single_query"):
        sides = {s.name: s for s in get_workload(workload).sides(opts)}
        for name in ("ort fp32", "ort int8", "fastembed"):
            assert "needs onnxruntime" in sides[name].skip
            assert "-m pip install" in sides[name].skip and "onnxruntime==" in sides[name].skip
        assert sides["pooler"].skip is None
