"""Quantized output vectors (issue 16): pooler's numbers equal sentence-transformers'
`quantize_embeddings`, offline (Engine.embed(precision=...)) and as a function."""
from __future__ import annotations

import numpy as np
import pytest

from pooler.quantize_output import PRECISIONS, quantize_embeddings

st_quantization = pytest.importorskip("sentence_transformers.quantization")

TEXTS = ["a cat sat on the mat", "dogs bark", "the stock market fell sharply today",
         "quantum physics is hard", "I like green tea", "short",
         "a much longer sentence about embeddings, vectors and how they are compressed"]

CALIBRATION = ["the weather is nice", "a recipe for bread", "football results", "how to code",
               "the history of Rome", "music festivals in summer", "a broken laptop screen",
               "mountains and rivers", "tax returns are due", "an opera in three acts"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dim", [16, 40])
def test_function_matches_sentence_transformers(precision, dim):
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((40, dim)).astype(np.float32)
    calibration = rng.standard_normal((200, dim)).astype(np.float32)
    ranges = np.vstack([np.full(dim, -2.5), np.full(dim, 2.5)]).astype(np.float32)
    cases = [{}]
    if precision in ("int8", "uint8"):
        cases += [{"calibration_embeddings": calibration}, {"ranges": ranges}]
    for kwargs in cases:
        ours = quantize_embeddings(embeddings, precision, **kwargs)
        theirs = st_quantization.quantize_embeddings(embeddings, precision, **kwargs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, kwargs
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_engine_embed_precision_matches_sentence_transformers(precision, minilm_engine,
                                                              st_minilm):
    floats = st_minilm.encode(TEXTS, convert_to_numpy=True)  # [7, 384]
    # calibration texts other than the inputs: an input that *is* a calibration extreme sits
    # exactly on bucket 0 or 255, where float noise decides the bucket
    calibration = st_minilm.encode(CALIBRATION, convert_to_numpy=True)
    kwargs = {"calibration_embeddings": calibration} if precision in ("int8", "uint8") else {}
    ours = np.stack([o.embedding for o in minilm_engine.embed(TEXTS, precision=precision,
                                                              **kwargs)])
    theirs = st_quantization.quantize_embeddings(floats, precision, **kwargs)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    if precision == "float32":
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    elif precision in ("int8", "uint8"):
        # float32 differences of ~1e-7 may move a value across a bucket edge: one step at most
        diff = np.abs(ours.astype(int) - theirs.astype(int))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    else:
        # a sign flip needs a component within float error of 0: allow a handful of bits
        flips = np.unpackbits((ours.view(np.uint8) ^ theirs.view(np.uint8))).sum()
        assert flips <= 2


def test_binary_packs_each_row():
    """A dimension that is not a multiple of 8: each row gets its own padded last byte."""
    embeddings = np.random.default_rng(1).standard_normal((3, 13)).astype(np.float32)
    ours = quantize_embeddings(embeddings, "ubinary")
    assert ours.shape == (3, 2)
    for row, packed in zip(embeddings, ours):
        np.testing.assert_array_equal(packed, np.packbits(row > 0))
    np.testing.assert_array_equal(quantize_embeddings(embeddings, "binary"),
                                  (ours.astype(int) - 128).astype(np.int8))


def test_sizes_and_errors(minilm_engine):
    out = minilm_engine.embed(["a", "b"], precision="ubinary")
    assert out[0].embedding.dtype == np.uint8 and out[0].embedding.shape == (48,)
    with pytest.raises(ValueError, match="precision"):
        minilm_engine.embed("a", precision="int4")
    with pytest.raises(ValueError, match="ranges"):  # one vector has no range to learn from
        minilm_engine.embed("a", precision="int8")
    with pytest.raises(ValueError, match=r"\[2, 384\]"):
        minilm_engine.embed("a", precision="int8", ranges=np.zeros((2, 3)))
    ranged = minilm_engine.embed("a", precision="int8",
                                 ranges=np.vstack([-np.ones(384), np.ones(384)]))
    assert ranged[0].embedding.dtype == np.int8
