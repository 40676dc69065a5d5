"""embed options and error paths on the real MiniLM model."""
import numpy as np
import pytest


def test_dimensions_truncate_then_renormalize(minilm_engine):
    full = minilm_engine.embed(["matryoshka test"])[0].embedding
    short = minilm_engine.embed(["matryoshka test"], dimensions=64)[0].embedding
    assert short.shape == (64,)
    assert np.isclose(np.linalg.norm(short), 1.0, atol=1e-6)
    expected = full[:64] / np.linalg.norm(full[:64])
    assert np.abs(short - expected).max() <= 1e-6


def test_normalize_off_gives_raw_mean_pooling(minilm_engine, st_minilm):
    raw = minilm_engine.embed(["not normalized"], normalize=False)[0].embedding
    assert not np.isclose(np.linalg.norm(raw), 1.0, atol=1e-3)
    normalized = minilm_engine.embed(["not normalized"])[0].embedding
    assert np.abs(raw / np.linalg.norm(raw) - normalized).max() <= 1e-6


def test_token_id_inputs_match_text(minilm_engine):
    text = "token ids in, same vector out"
    ids = minilm_engine.tokenizer.encode_batch([text])[0].input_ids
    by_text = minilm_engine.embed(text)[0].embedding
    by_ids = minilm_engine.embed(ids)[0].embedding          # one token-id list
    by_list = minilm_engine.embed([ids, ids])                # a list of token-id lists
    by_dict = minilm_engine.embed([{"prompt_token_ids": ids}])[0].embedding
    for v in (by_ids, by_list[0].embedding, by_list[1].embedding, by_dict):
        assert np.abs(v - by_text).max() <= 1e-6


def test_truncate_prompt_tokens(minilm_engine):
    text = "one two three four five six seven eight nine ten"
    out = minilm_engine.embed([text], truncate_prompt_tokens=5)[0]
    assert out.num_tokens == 5
    ids = minilm_engine.tokenizer.encode_batch([text])[0].input_ids
    manual = ids[:4] + [ids[-1]]  # [CLS] one two three [SEP]
    assert np.abs(minilm_engine.embed([manual])[0].embedding - out.embedding).max() <= 1e-6
    left = minilm_engine.embed([text], truncate_prompt_tokens=5, truncation_direction="left")[0]
    assert np.abs(left.embedding - out.embedding).max() > 1e-3


def test_over_long_without_truncation_is_an_error(minilm_engine):
    with pytest.raises(ValueError, match=r"Input 1 has \d+ tokens.*truncate=True"):
        minilm_engine.embed(["short", "word " * 400], truncate=False)
    # The same call with truncation works and the engine is still healthy.
    assert len(minilm_engine.embed(["short", "word " * 400])) == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"dimensions": 1000}, "dimensions=1000 is larger than the model's embedding size 384"),
    ({"dimensions": 0}, "dimensions must be a positive integer"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be a positive integer"),
    ({"truncate_prompt_tokens": 5000}, "exceeds the model's maximum input length 256"),
    ({"prompt_name": "nope"}, "prompt_name 'nope' is not declared"),
    ({"truncation_direction": "middle"}, "truncation_direction must be"),
])
def test_bad_options(minilm_engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        minilm_engine.embed(["x"], **kwargs)


@pytest.mark.parametrize("inputs, match", [
    ([], "is empty"),
    (None, "must be a string"),
    ([1.5], "must be a string or a list of token ids"),
    ([[]], "empty token-id list"),
    ([[10**9]], "outside the vocabulary"),
    ([{"foo": 1}], "without 'prompt'"),
])
def test_bad_inputs(minilm_engine, inputs, match):
    with pytest.raises(ValueError, match=match):
        minilm_engine.embed(inputs)


def test_unknown_task_and_unsupported_task(minilm_engine):
    from pooler import PoolingParams
    with pytest.raises(ValueError, match="Unknown task: 'nope'"):
        minilm_engine.encode(["x"], PoolingParams(task="nope"))
    with pytest.raises(ValueError, match="Unsupported task: 'classify'"):
        minilm_engine.encode(["x"], PoolingParams(task="classify"))


def test_progress_bar_default(minilm_engine, capsys):
    minilm_engine.embed(["a"] * 5)
    assert "pooling" not in capsys.readouterr().err
    minilm_engine.embed(["a"] * 5, use_tqdm=True)
    assert "pooling" in capsys.readouterr().err


def test_failing_request_does_not_lose_neighbours(minilm_engine, monkeypatch):
    """A request whose pooling raises fails alone; the rest of its batch completes."""
    from pooler.pooling import poolers

    original = poolers.finalize_embeddings

    def flaky(vectors, params):
        if any(p.extra.get("explode") for p in params):
            raise RuntimeError("boom")
        return original(vectors, params)

    monkeypatch.setattr(poolers, "finalize_embeddings", flaky)
    from pooler import PoolingParams
    processed = minilm_engine.processor.process(["a", "b", "c", "d", "e"])
    params = [minilm_engine.verify_params(PoolingParams(task="embed")) for _ in processed]
    params[2].extra["explode"] = True
    results = minilm_engine.run_processed(processed, params, raise_on_error=False)
    assert [r.error is None for r in results] == [True, True, False, True, True]
    assert "boom" in results[2].error
    good = minilm_engine.embed(["a"])[0].embedding
    assert np.abs(results[0].data.numpy() - good).max() <= 1e-6
