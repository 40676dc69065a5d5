"""Long inputs on the real all-MiniLM-L6-v2: chunked processing against sentence-transformers
run window by window, and late chunking against the document's own token embeddings."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pooler.engine import long_inputs
from pooler.engine.input_processor import ProcessedInput

LONG = ("Retrieval systems split documents into passages. " * 6 +
        "Late chunking keeps the context of the whole document. " * 4).strip()
SHORT = "a short sentence"
MAX_LEN = 32


@pytest.fixture(scope="module")
def engine(minilm_path):
    from pooler import Engine
    return Engine(str(minilm_path), max_model_len=MAX_LEN)


def _st_window_vector(st, ids: list[int]) -> np.ndarray:
    """sentence-transformers' Transformer + Pooling (no Normalize) on one window's token ids."""
    features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids),
                                                                               dtype=torch.long),
                "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        features = st[1](st[0](features))
    return features["sentence_embedding"][0].double().numpy()


@pytest.mark.parametrize("overlap", [0, 5])
def test_chunked_embedding_matches_window_by_window_reference(engine, st_minilm, overlap):
    tokenizer = st_minilm.tokenizer
    ids = tokenizer(LONG)["input_ids"]
    assert len(ids) > 2 * MAX_LEN  # really several windows
    content = ids[1:-1]
    room = MAX_LEN - 2
    windows, start = [], 0
    while True:
        end = min(start + room, len(content))
        windows.append(content[start:end])
        if end == len(content):
            break
        start = end - overlap
    vectors = [_st_window_vector(st_minilm, [ids[0]] + w + [ids[-1]]) for w in windows]
    weights = np.array([len(w) for w in windows], dtype=np.float64)[:, None]
    reference = (np.stack(vectors) * weights).sum(0) / weights.sum()
    reference /= np.linalg.norm(reference)

    long_out, short_out = engine.embed([LONG, SHORT], long_input="chunk",
                                       chunk_overlap=overlap)
    np.testing.assert_allclose(long_out.embedding, reference, atol=1e-5)
    assert long_out.num_tokens == sum(len(w) + 2 for w in windows)
    # An input that fits is embedded exactly as without chunking.
    np.testing.assert_allclose(short_out.embedding, engine.embed(SHORT)[0].embedding, atol=1e-6)
    # Matryoshka truncation applies after the windows are averaged.
    [cut] = engine.embed(LONG, long_input="chunk", chunk_overlap=overlap, dimensions=8)
    np.testing.assert_allclose(cut.embedding, reference[:8] / np.linalg.norm(reference[:8]),
                               atol=1e-5)


def test_default_still_truncates(engine):
    [truncated] = engine.embed(LONG)
    [chunked] = engine.embed(LONG, long_input="chunk")
    assert truncated.num_tokens == MAX_LEN
    assert float(truncated.embedding @ chunked.embedding) < 0.9999


def test_bad_long_input_options_are_clear_errors(engine):
    with pytest.raises(ValueError, match="long_input must be one of"):
        engine.embed(LONG, long_input="split")
    with pytest.raises(ValueError, match="chunk_overlap=30 must be smaller"):
        engine.embed(LONG, long_input="chunk", chunk_overlap=30)
    with pytest.raises(ValueError, match="chunk_overlap must be a non-negative"):
        engine.embed(LONG, long_input="chunk", chunk_overlap=-1)


def test_windows_cover_every_content_token_once_without_overlap():
    item = ProcessedInput(prompt_token_ids=[101] + list(range(1000, 1050)) + [102],
                          special_tokens_mask=[1] + [0] * 50 + [1])
    windows = long_inputs.split_into_windows(item, 16, 0)
    assert [len(w.prompt_token_ids) for w in windows.inputs] == [16, 16, 16, 10]
    assert all(w.prompt_token_ids[0] == 101 and w.prompt_token_ids[-1] == 102
               for w in windows.inputs)
    content = [t for w in windows.inputs for t in w.prompt_token_ids[1:-1]]
    assert content == list(range(1000, 1050))


# ---- late chunking ----------------------------------------------------------------------------
DOC = ("Berlin is the capital of Germany. It has about 3.8 million inhabitants. "
       "The city is known for its museums.")


@pytest.fixture(scope="module")
def full_engine(minilm_path):
    from pooler import Engine
    return Engine(str(minilm_path))


def _token_reference(engine, text):
    """The document's token embeddings (raw) with their offsets, special tokens dropped."""
    [item] = engine.processor.process([text])
    [tokens] = engine.token_embed(text, normalize=False)
    keep = [i for i, m in enumerate(item.special_tokens_mask) if not m]
    return tokens.embeddings[keep].astype(np.float64), [item.offsets[i] for i in keep]


def test_late_chunks_are_means_of_the_documents_token_embeddings(full_engine):
    vectors, offsets = _token_reference(full_engine, DOC)
    chunks = full_engine.embed_chunks(DOC)
    assert [c.text for c in chunks] == ["Berlin is the capital of Germany.",
                                        "It has about 3.8 million inhabitants.",
                                        "The city is known for its museums."]
    for chunk in chunks:
        inside = [i for i, (s, e) in enumerate(offsets) if s < chunk.end and e > chunk.start]
        assert chunk.num_tokens == len(inside)
        reference = vectors[inside].mean(0)
        reference /= np.linalg.norm(reference)
        np.testing.assert_allclose(chunk.embedding, reference, atol=1e-6)
    # Context: the second sentence's vector differs from embedding that sentence alone.
    alone = full_engine.embed(chunks[1].text)[0].embedding
    assert float(alone @ chunks[1].embedding) < 0.9999


def test_late_chunking_with_explicit_spans_and_a_long_document(engine, full_engine):
    spans = [(0, 6), (7, 33)]
    [a, b] = full_engine.embed_chunks(DOC, spans)
    assert (a.text, b.text) == ("Berlin", "is the capital of Germany.")
    # A document longer than the max length is encoded in overlapping windows: every chunk
    # still gets a vector, and with windows as long as the document the result is unchanged.
    long_doc = " ".join([DOC] * 4)
    windowed = engine.embed_chunks(long_doc)
    assert len(windowed) == 12 and all(np.isfinite(c.embedding).all() for c in windowed)
    whole = full_engine.embed_chunks(long_doc)
    sims = [float(x.embedding @ y.embedding) for x, y in zip(windowed, whole)]
    assert min(sims) > 0.8  # context differs at the window edges, not the meaning


def test_late_chunking_errors(full_engine):
    with pytest.raises(ValueError, match=r"chunks\[0\]=\(5, 500\)"):
        full_engine.embed_chunks(DOC, [(5, 500)])
    with pytest.raises(ValueError, match="document must be a non-empty string"):
        full_engine.embed_chunks("   ")
    with pytest.raises(ValueError, match="chunker must be 'sentences'"):
        full_engine.embed_chunks(DOC, chunker="paragraphs")
