"""Engine.embedding_size is the length of what `embed` returns, for every kind of embed pooler
and both runners, and verify_params holds `dimensions` to it (and token_embed to its size)."""
from __future__ import annotations

import numpy as np
import pytest

from pooler import Engine
from pooler.params import PoolingParams
from tests.models.tiny import add_st_pooling, save_tiny_bert

TEXTS = ["x", "a somewhat longer text about embedding sizes"]


def _assert_size_matches_embed(engine: Engine, expected: int) -> None:
    assert engine.embedding_size == expected
    assert [o.embedding.shape for o in engine.embed(TEXTS)] == [(expected,)] * len(TEXTS)
    assert engine.embed(TEXTS[0], dimensions=expected)[0].embedding.shape == (expected,)
    with pytest.raises(ValueError, match=f"larger than the model's embedding size {expected}"):
        engine.embed(TEXTS[0], dimensions=expected + 1)


@pytest.fixture(scope="module")
def dense_folder(tmp_path_factory, minilm_path):
    """A sentence-transformers folder: random 2-layer BERT (hidden 32), mean pooling, then a
    Dense 32 -> 12 with tanh, saved by SentenceTransformer.save."""
    st = pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers import models  # a submodule v6 no longer imports eagerly

    root = tmp_path_factory.mktemp("dense")
    bert = save_tiny_bert(root / "bert", minilm_path, seed=3)
    transformer = models.Transformer(str(bert))
    torch.manual_seed(3)
    dense = models.Dense(32, 12, activation_function=torch.nn.Tanh())
    model = st.SentenceTransformer(modules=[transformer, models.Pooling(32, "mean"), dense],
                                   device="cpu")
    model.save(str(root / "st"))
    return root / "st", model


def test_plain_model(minilm_engine):
    _assert_size_matches_embed(minilm_engine, 384)


@pytest.mark.parametrize("runner", ["native", "transformers"])
def test_dense_projected_model(dense_folder, runner):
    folder, reference = dense_folder
    engine = Engine(str(folder), runner=runner)
    _assert_size_matches_embed(engine, 12)
    np.testing.assert_allclose(np.stack([o.embedding for o in engine.embed(TEXTS)]),
                               reference.encode(TEXTS), atol=1e-5)
    # token_embed vectors are the transformer's (before Dense), so their size is the hidden one.
    assert engine.token_embed(TEXTS[0])[0].embeddings.shape[-1] == 32
    with pytest.raises(ValueError, match="token embedding size 32"):
        engine.verify_params(PoolingParams(task="token_embed", dimensions=33))


def test_transformers_runner_plain_base_model(tmp_path, minilm_path, monkeypatch):
    import pooler.checkpoint

    folder = save_tiny_bert(tmp_path / "bert", minilm_path, seed=5)
    add_st_pooling(folder, "mean")
    read = []  # names of the tensors pooler itself reads from the checkpoint
    real_iterate = pooler.checkpoint.iterate_weights

    def counting_iterate(path):
        for name, tensor in real_iterate(path):
            read.append(name)
            yield name, tensor
    monkeypatch.setattr(pooler.checkpoint, "iterate_weights", counting_iterate)
    engine = Engine(str(folder), runner="transformers")
    assert read == []  # no pooler-side head: transformers' own load is the only read
    _assert_size_matches_embed(engine, 32)


@pytest.mark.parametrize("runner", ["native", "transformers"])
def test_no_embed_task_means_no_size(tmp_path, minilm_path, runner):
    folder = save_tiny_bert(tmp_path / "cls", minilm_path,
                            architecture="BertForSequenceClassification", num_labels=3)
    engine = Engine(str(folder), runner=runner)
    assert "embed" not in engine.supported_tasks
    assert engine.embedding_size is None


@pytest.mark.parametrize("declared", [True, False])
def test_splade_model(tmp_path, declared):
    """A folder that declares SpladePooling embeds into the vocabulary (sparse by default);
    a bare *ForMaskedLM folder embeds densely (the hidden size)."""
    from tests.models.modernbert_folders import build_modernbert

    model = build_modernbert(tmp_path / "mlm", "ModernBertForMaskedLM", seed=6)
    folder = tmp_path / "mlm"
    if declared:
        from sentence_transformers import SparseEncoder
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

        SparseEncoder(modules=[MLMTransformer(str(folder)), SpladePooling("max")],
                      device="cpu").save(str(tmp_path / "splade"))
        folder = tmp_path / "splade"
    engine = Engine(str(folder), device="cpu")
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    assert vocab != hidden
    expected = vocab if declared else hidden
    assert engine.embedding_size == expected
    assert [o.embedding.shape for o in engine.embed(TEXTS)] == [(expected,)] * len(TEXTS)
    # Sparse vectors take no `dimensions` at all; dense ones at most their size.
    error = "dimensions does not apply to sparse" if declared else f"embedding size {expected}"
    with pytest.raises(ValueError, match=error):
        engine.embed(TEXTS[0], dimensions=expected + 1)
