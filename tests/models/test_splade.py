"""SPLADE sparse embeddings: parity with sentence-transformers SparseEncoder (weights atol 1e-4,
identical non-zero sets above 1e-3), on the real splade-tiny model and on seeded random MLMs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pooler import Engine
from pooler.params import PoolingParams

# ../shared from the repo root (a worktree one level deeper finds it one more level up).
_ROOT = Path(__file__).resolve().parents[2]
SPLADE_TINY = next((p for p in (_ROOT / ".." / "shared" / "models" / "splade-tiny",
                                _ROOT / ".." / ".." / "shared" / "models" / "splade-tiny")
                    if (p / "config.json").is_file()), _ROOT / ".." / "shared" / "splade-tiny")
needs_splade_tiny = pytest.mark.skipif(not (SPLADE_TINY / "config.json").is_file(),
                                       reason="../shared/models/splade-tiny is absent")

TEXTS = [
    "what is the weather in new york today?",
    "SPLADE expands a text into weighted vocabulary terms.",
    "a",
    "The cat sat on the mat, and the dog slept by the fire while rain fell on the roof "
    "of the old farmhouse at the edge of the village.",
    "sparse retrieval",
]


def _sparse_encoder(folder, pooling: str = "max", activation: str = "relu"):
    """A SparseEncoder built as sentence-transformers builds one for a plain MLM folder."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    return SparseEncoder(modules=[MLMTransformer(str(folder)),
                                  SpladePooling(pooling_strategy=pooling,
                                                activation_function=activation)],
                         device="cpu")


def _dense(outputs, vocab: int) -> np.ndarray:
    out = np.zeros((len(outputs), vocab), dtype=np.float32)
    for row, o in zip(out, outputs):
        row[o.indices] = o.values
    return out


def _assert_same_sparse(got: np.ndarray, expected: np.ndarray):
    np.testing.assert_allclose(got, expected, atol=1e-4)
    for g, e in zip(got, expected):
        assert set(np.flatnonzero(g > 1e-3)) == set(np.flatnonzero(e > 1e-3))


@pytest.fixture(scope="module")
def splade_engine():
    if not (SPLADE_TINY / "config.json").is_file():
        pytest.skip("../shared/models/splade-tiny is absent")
    return Engine(str(SPLADE_TINY), device="cpu")


@needs_splade_tiny
@pytest.mark.parametrize("pooling", ["max", "sum"])
def test_splade_tiny_matches_sparse_encoder(splade_engine, pooling):
    expected = _sparse_encoder(SPLADE_TINY, pooling).encode(
        TEXTS, convert_to_tensor=True).to_dense().numpy()
    got = splade_engine.embed_sparse(TEXTS, pooling=pooling)
    assert expected.shape[1] == 30522
    _assert_same_sparse(_dense(got, expected.shape[1]), expected)
    # Sorted by weight, token strings are the vocabulary's.
    first = got[0]
    assert np.all(np.diff(first.values) <= 0)
    assert first.tokens == [splade_engine.tokenizer.id_to_token(int(i)) for i in first.indices]
    assert first.to_dict() == {int(i): float(v) for i, v in zip(first.indices, first.values)}


@needs_splade_tiny
def test_single_equals_batched_and_options(splade_engine):
    batched = splade_engine.embed_sparse(TEXTS)
    alone = splade_engine.embed_sparse(TEXTS[3])[0]
    np.testing.assert_allclose(_dense([alone], 30522), _dense([batched[3]], 30522), atol=1e-5)
    full = batched[1]
    top = splade_engine.embed_sparse(TEXTS[1], top_k=5)[0]
    np.testing.assert_array_equal(top.indices, full.indices[:5])
    cut = splade_engine.embed_sparse(TEXTS[1], threshold=1.0)[0]
    np.testing.assert_array_equal(cut.indices, full.indices[full.values > 1.0])


@needs_splade_tiny
def test_skip_special_tokens_drops_cls_and_sep(splade_engine):
    from sentence_transformers.sparse_encoder.models import MLMTransformer

    mlm = MLMTransformer(str(SPLADE_TINY))
    features = mlm.tokenize(TEXTS[:2])
    with torch.no_grad():
        logits = mlm(dict(features))["token_embeddings"]  # [batch, seq, vocab]
    got = _dense(splade_engine.embed_sparse(TEXTS[:2], skip_special_tokens=True), 30522)
    for i in range(2):
        n = int(features["attention_mask"][i].sum())
        inner = logits[i, 1:n - 1]  # without [CLS] ... [SEP]
        expected = torch.log1p(torch.relu(inner)).max(dim=0).values.numpy()
        _assert_same_sparse(got[i:i + 1], expected[None])


@needs_splade_tiny
def test_dense_embed_still_served_and_mixed_with_sparse(splade_engine):
    """Plain embed on an undeclared MLM folder stays dense; sparse requests share the batch."""
    outputs = splade_engine.encode(TEXTS[:2], PoolingParams(task="embed"))
    assert outputs[0].data.shape == (128,)
    sparse = splade_engine.encode(TEXTS[:2], PoolingParams(task="embed", extra={"sparse": True}))
    assert sparse[0].data.shape == (30522,)
    with pytest.raises(ValueError, match="top_k"):
        splade_engine.embed_sparse("x", top_k=0)
    with pytest.raises(ValueError, match="pooling"):
        splade_engine.embed_sparse("x", pooling="mean")


@needs_splade_tiny
def test_declared_sparse_encoder_folder(tmp_path):
    """A saved SparseEncoder folder (modules.json: MLMTransformer + SpladePooling(sum))."""
    model = _sparse_encoder(SPLADE_TINY, "sum")
    model.save(str(tmp_path / "st"))
    engine = Engine(str(tmp_path / "st"), device="cpu")
    expected = model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    _assert_same_sparse(_dense(engine.embed_sparse(TEXTS), 30522), expected)
    # A folder that declares SPLADE makes sparse the default of plain embed.
    vectors = engine.embed(TEXTS)
    np.testing.assert_allclose(np.stack([v.embedding for v in vectors]), expected, atol=1e-4)


@needs_splade_tiny
def test_dimensions_on_sparse_vectors_is_a_clear_error(tmp_path, splade_engine):
    """A sparse vector has one weight per vocabulary term: `dimensions` cannot apply, and
    the request fails before it is queued, not inside a batch."""
    _sparse_encoder(SPLADE_TINY).save(str(tmp_path / "st"))
    declared = Engine(str(tmp_path / "st"), device="cpu")
    with pytest.raises(ValueError, match="dimensions does not apply to sparse.*top_k"):
        declared.embed(TEXTS[:2], dimensions=8)
    sparse = PoolingParams(task="embed", dimensions=8, extra={"sparse": {}})
    with pytest.raises(ValueError, match="dimensions does not apply to sparse"):
        splade_engine.verify_params(sparse)
    # A plain MLM folder's embed is dense by default: dimensions truncates as usual.
    assert splade_engine.embed(TEXTS[:2], dimensions=8)[0].embedding.shape == (8,)


@needs_splade_tiny
def test_inference_free_router_folder(tmp_path):
    """Router: query = SparseStaticEmbedding (static weights), document = SPLADE."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.models import (MLMTransformer,
                                                             SparseStaticEmbedding, SpladePooling)

    doc = MLMTransformer(str(SPLADE_TINY))
    weight = torch.rand(doc.tokenizer.vocab_size, generator=torch.Generator().manual_seed(0)) * 3
    router = Router.for_query_document(
        query_modules=[SparseStaticEmbedding(tokenizer=doc.tokenizer, weight=weight, frozen=True)],
        document_modules=[doc, SpladePooling("max", activation_function="log1p_relu")])
    SparseEncoder(modules=[router], similarity_fn_name="dot").save(str(tmp_path / "if"))
    reference = SparseEncoder(str(tmp_path / "if"), device="cpu")
    engine = Engine(str(tmp_path / "if"), device="cpu")

    queries = engine.embed_sparse(TEXTS, query=True)
    expected_q = reference.encode_query(TEXTS, convert_to_tensor=True).to_dense().numpy()
    _assert_same_sparse(_dense(queries, 30522), expected_q)
    docs = engine.embed_sparse(TEXTS)
    expected_d = reference.encode_document(TEXTS, convert_to_tensor=True).to_dense().numpy()
    _assert_same_sparse(_dense(docs, 30522), expected_d)


@needs_splade_tiny
def test_inference_free_idf_json_folder(tmp_path):
    """A hand-built Router folder whose query module points at an idf.json {token: weight}."""
    import shutil

    root = tmp_path / "idf"
    doc = root / "document_0_MLMTransformer"
    query = root / "query_0_SparseStaticEmbedding"
    shutil.copytree(SPLADE_TINY, doc)
    (root / "document_1_SpladePooling").mkdir()
    (root / "document_1_SpladePooling" / "config.json").write_text(json.dumps(
        {"pooling_strategy": "max", "activation_function": "relu"}))
    query.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SPLADE_TINY / name, query / name)
    idf = {"weather": 4.5, "new": 1.25, "york": 3.0, "today": 2.0, "?": 0.5, "cat": 2.5}
    (query / "idf.json").write_text(json.dumps(idf))
    (query / "config.json").write_text(json.dumps({"frozen": True, "path": "idf.json"}))
    prefix = "sentence_transformers.sparse_encoder.models."
    (root / "router_config.json").write_text(json.dumps({
        "types": {"query_0_SparseStaticEmbedding": prefix + "SparseStaticEmbedding",
                  "document_0_MLMTransformer": prefix + "MLMTransformer",
                  "document_1_SpladePooling": prefix + "SpladePooling"},
        "structure": {"query": ["query_0_SparseStaticEmbedding"],
                      "document": ["document_0_MLMTransformer", "document_1_SpladePooling"]},
        "parameters": {"default_route": "document", "allow_empty_key": True}}))
    (root / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}]))
    engine = Engine(str(root), device="cpu")
    q = engine.embed_sparse(["What is the weather in New York today? today"], query=True)[0]
    assert q.to_token_dict() == {"weather": 4.5, "york": 3.0, "today": 2.0, "new": 1.25,
                                 "?": 0.5}
    assert q.num_tokens == 10  # what is the weather in new york today ? today
    # Documents still run the model.
    d = engine.embed_sparse(["the weather in new york"])[0]
    assert len(d.indices) > 5


def test_embed_sparse_needs_a_masked_lm(tmp_path):
    from tests.models.modernbert_folders import build_modernbert

    build_modernbert(tmp_path / "base", "ModernBertModel")
    with pytest.raises(ValueError, match="masked-LM"):
        Engine(str(tmp_path / "base"), device="cpu").embed_sparse("text")


@pytest.mark.parametrize("tie", [True, False])
def test_modernbert_splade_matches_sparse_encoder(tmp_path, tie):
    """SPLADE on a seeded random ModernBertForMaskedLM (tied and untied decoder)."""
    from tests.models.modernbert_folders import TEXTS as MB_TEXTS
    from tests.models.modernbert_folders import build_modernbert

    folder = tmp_path / "mb_mlm"
    model = build_modernbert(folder, "ModernBertForMaskedLM", seed=4, tie_word_embeddings=tie)
    vocab = model.config.vocab_size
    expected = _sparse_encoder(folder).encode(MB_TEXTS, convert_to_tensor=True).to_dense().numpy()
    got = Engine(str(folder), device="cpu").embed_sparse(MB_TEXTS)
    _assert_same_sparse(_dense(got, vocab), expected)


@needs_splade_tiny
def test_sparse_and_dense_requests_in_one_batch(splade_engine):
    """One step packs a sparse and a dense embed request; each gets its own pooler's output."""
    processed = splade_engine.processor.process(TEXTS[:2])
    sparse = splade_engine.verify_params(PoolingParams(task="embed", extra={"sparse": True}))
    dense = splade_engine.verify_params(PoolingParams(task="embed", normalize=False))
    mixed = splade_engine.run_processed(processed, [sparse, dense])
    alone_sparse = splade_engine.embed_sparse(TEXTS[0])[0]
    alone_dense = splade_engine.embed(TEXTS[1], normalize=False)[0]
    np.testing.assert_allclose(_dense([alone_sparse], 30522)[0], mixed[0].data.numpy(), atol=1e-5)
    np.testing.assert_allclose(alone_dense.embedding, mixed[1].data.numpy(), atol=1e-5)


@needs_splade_tiny
def test_transformers_fallback_runner_serves_splade(splade_engine):
    """runner='transformers' loads the masked-LM head into the SPLADE pooler too, and takes
    reset_cache like the native runner."""
    fallback = Engine(str(SPLADE_TINY), device="cpu", runner="transformers")
    fallback.reset_cache()
    _assert_same_sparse(_dense(fallback.embed_sparse(TEXTS), 30522),
                        _dense(splade_engine.embed_sparse(TEXTS), 30522))
