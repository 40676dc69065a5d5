"""all-MiniLM-L6-v2: pooler vs sentence-transformers on the same real weights."""
import numpy as np
import pytest

from tests.texts import varied_texts


@pytest.fixture(scope="module")
def texts():
    return varied_texts(200)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_parity_with_sentence_transformers(minilm_engine, st_minilm, texts):
    ours = np.stack([o.embedding for o in minilm_engine.embed(texts)])
    ref = st_minilm.encode(texts, batch_size=32, convert_to_numpy=True)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (200, 384)
    assert _cosines(ours, ref).min() >= 0.99999
    assert np.abs(ours - ref).max() <= 1e-5


def test_truncation_matches_max_seq_length(minilm_engine, st_minilm):
    long_text = "word " * 600
    out = minilm_engine.embed([long_text])[0]
    assert out.num_tokens == 256  # sentence_bert_config.json max_seq_length
    ref = st_minilm.encode([long_text])[0]
    assert np.abs(out.embedding - ref).max() <= 1e-5


def test_batch_invariance(minilm_engine, texts):
    batch = minilm_engine.embed(texts[:64])
    for i in (0, 7, 20, 63):
        alone = minilm_engine.embed([texts[i]])[0].embedding
        assert np.abs(alone - batch[i].embedding).max() <= 1e-5


def test_results_in_input_order_under_small_budget(minilm_path, texts):
    from pooler import Engine
    # A tiny budget forces many steps; results must still come back in input order.
    engine = Engine(str(minilm_path), max_num_batched_tokens=300, max_num_seqs=3)
    small = engine.embed(texts[:30])
    ref = Engine(str(minilm_path)).embed(texts[:30])
    for a, b in zip(small, ref):
        assert np.abs(a.embedding - b.embedding).max() <= 1e-5


def test_prompt_name_matches_sentence_transformers(minilm_path, tmp_path):
    import shutil
    import json
    from pooler import Engine
    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path / "minilm-prompts"
    shutil.copytree(minilm_path, folder)
    cfg = json.loads((folder / "config_sentence_transformers.json").read_text())
    cfg["prompts"] = {"query": "query: ", "passage": "passage: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(cfg))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling["include_prompt"] = False
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    engine = Engine(str(folder))
    ref_model = st.SentenceTransformer(str(folder), device="cpu")
    texts = ["how do I reset my password", "a longer query about the weather in Paris today"]
    ours = np.stack([o.embedding for o in engine.embed(texts, prompt_name="query")])
    ref = ref_model.encode(texts, prompt_name="query")
    assert np.abs(ours - ref).max() <= 1e-5
    literal = np.stack([o.embedding for o in engine.embed(texts, prompt="query: ")])
    assert np.abs(literal - ref).max() <= 1e-5
    plain = np.stack([o.embedding for o in engine.embed(texts)])
    assert np.abs(plain - ref).max() > 1e-3  # the prompt really changes the result
