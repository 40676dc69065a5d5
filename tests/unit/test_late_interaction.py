"""LateInteractionRunner and the model runner's lifecycle rules for ColBERT scoring."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pooler.step_contract import SchedulerOutput
from pooler.params import LateInteractionParams, PoolingParams
from pooler.worker.late_interaction import LateInteractionRunner, maxsim
from pooler.worker.model_runner import ModelRunner
from pooler.worker.pooling_runner import PoolingRunner


def query(key, uses=None):
    return PoolingParams(task="token_embed",
                         late_interaction=LateInteractionParams("cache_query", key, uses))


def doc(key):
    return PoolingParams(task="token_embed",
                         late_interaction=LateInteractionParams("score_doc", key))


def vecs(n, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)


def brute_maxsim(q, d):
    return float((q @ d.T).max(dim=1).values.sum())


def run(li, items, finished=None):
    """items: (req_id, params, output). Registers, then post-processes one step."""
    for req_id, params, _ in items:
        li.register_request(req_id, params)
    return li.postprocess_pooler_output([o for *_, o in items], [p for _, p, _ in items],
                                        [r for r, *_ in items],
                                        finished or [True] * len(items))


# ---- params ----------------------------------------------------------------------------------
def test_params_validation():
    assert LateInteractionParams("cache_query", "k").query_uses == 1
    assert LateInteractionParams("cache_query", "k", 0).query_uses == 1
    assert LateInteractionParams("cache_query", "k", -3).query_uses == 1
    with pytest.raises(ValueError, match="query_uses must be an integer"):
        LateInteractionParams("cache_query", "k", 2.5)
    with pytest.raises(ValueError, match="query_uses must be an integer"):
        LateInteractionParams("cache_query", "k", True)
    with pytest.raises(ValueError, match="query_key must be a non-empty string"):
        LateInteractionParams("score_doc", "")
    with pytest.raises(ValueError, match="query_key must be a non-empty string"):
        LateInteractionParams("score_doc", None)
    with pytest.raises(ValueError, match="mode must be one of"):
        LateInteractionParams("rerank", "k")


def test_params_mutated_after_construction_are_rejected_at_registration():
    params = doc("k")
    params.late_interaction.mode = "bogus"
    with pytest.raises(ValueError, match="mode must be one of"):
        LateInteractionRunner().register_request("d", params)


def test_late_interaction_needs_token_embed_task():
    config = SimpleNamespace(st=None, colbert=object())
    with pytest.raises(ValueError, match="late_interaction needs task=.token_embed. \(ColBERT"):
        PoolingParams(task="embed", late_interaction=LateInteractionParams(
            "score_doc", "k")).verify(config, "embed")


# ---- caching and scoring ---------------------------------------------------------------------
def test_query_is_cached_as_a_copy_with_a_placeholder_output():
    li = LateInteractionRunner()
    buffer = vecs(4)
    expected = buffer.clone()
    outputs, errors = run(li, [("q", query("k", 2), buffer)])
    assert errors == {} and outputs[0].dim() == 0
    buffer.zero_()  # the pooler output may be a view into a reused buffer
    d = vecs(5, seed=1)
    outputs, errors = run(li, [("d", doc("k"), d)])
    assert errors == {}
    assert outputs[0].dim() == 0
    assert float(outputs[0]) == pytest.approx(brute_maxsim(expected, d), rel=1e-6)
    assert li.query_uses("k") == 1


def test_last_use_frees_the_entry():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 2), vecs(3))])
    run(li, [("d1", doc("k"), vecs(4, seed=1))])
    assert li.query_uses("k") == 1
    run(li, [("d2", doc("k"), vecs(4, seed=2))])
    assert li.num_cached_queries == 0 and li.num_pending_docs == 0


def test_doc_without_cached_query_fails_alone():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 1), vecs(3))])
    plain = vecs(2, seed=9)
    outputs, errors = run(li, [("lost", doc("missing"), vecs(4)), ("d", doc("k"), vecs(4)),
                               ("other", PoolingParams(task="token_embed"), plain)])
    assert set(errors) == {"lost"}
    assert "Queries must run" in errors["lost"] and "before their documents" in errors["lost"]
    assert outputs[0] is None and outputs[1].dim() == 0
    assert outputs[2] is plain  # requests without late interaction pass through untouched
    assert li.num_cached_queries == 0 and li.num_pending_docs == 0


def test_query_and_its_doc_in_the_same_step_is_an_error():
    li = LateInteractionRunner()
    _, errors = run(li, [("q", query("k", 1), vecs(3)), ("d", doc("k"), vecs(4))])
    assert "not cached" in errors["d"]
    # The failed doc was one of the query's uses: it releases it, which frees the entry.
    assert li.num_cached_queries == 0 and li.num_pending_docs == 0


def test_duplicate_query_key_fails_that_request():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 1), vecs(3))])
    _, errors = run(li, [("q2", query("k", 5), vecs(3))])
    assert "already cached" in errors["q2"] and li.query_uses("k") == 1


def test_unfinished_requests_are_skipped():
    li = LateInteractionRunner()
    q = vecs(3)
    outputs, errors = run(li, [("q", query("k"), q)], finished=[False])
    assert outputs[0] is q and errors == {} and li.num_cached_queries == 0


def test_batched_maxsim_over_mixed_docs_and_queries_equals_one_by_one():
    li = LateInteractionRunner(chunk_tokens=3)  # chunks cut through documents
    qa, qb = vecs(4, seed=1), vecs(6, seed=2)
    run(li, [("qa", query("a", 3), qa), ("qb", query("b", 2), qb)])
    docs = [("d0", "a", vecs(1, seed=3)), ("d1", "b", vecs(7, seed=4)),
            ("d2", "a", vecs(5, seed=5)), ("d3", "b", vecs(2, seed=6)),
            ("d4", "a", vecs(11, seed=7))]
    outputs, errors = run(li, [(r, doc(k), d) for r, k, d in docs])
    assert errors == {}
    for (_, key, d), out in zip(docs, outputs):
        expected = brute_maxsim(qa if key == "a" else qb, d)
        assert float(out) == pytest.approx(expected, rel=1e-5)
    assert li.num_cached_queries == 0


def test_maxsim_handles_negative_best_matches_without_padding_effects():
    q = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    short, long = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.9, 0.1]])
    scores = maxsim(q, [short, long], chunk_tokens=2)
    assert float(scores[0]) == pytest.approx(0.0)   # 1 + (-1): no zero padding wins
    assert float(scores[1]) == pytest.approx(1.0 + -0.5)


# ---- release rules ---------------------------------------------------------------------------
def test_aborted_doc_releases_exactly_once():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 3), vecs(3))])
    li.register_request("d", doc("k"))
    li.on_requests_finished(["d"])
    li.on_requests_finished(["d"])
    assert li.query_uses("k") == 2


def test_scored_doc_is_not_released_twice():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 3), vecs(3))])
    run(li, [("d", doc("k"), vecs(4))])
    li.on_requests_finished(["d"])
    assert li.query_uses("k") == 2


def test_non_doc_reregistration_clears_the_doc_record():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 2), vecs(3))])
    li.register_request("x", doc("k"))
    li.register_request("x", PoolingParams(task="token_embed"))
    li.on_requests_finished(["x"])
    assert li.query_uses("k") == 2


def test_unscheduled_abort_releases_from_params_once():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 3), vecs(3))])
    li.release_unscheduled({"d1": doc("k"), "x": PoolingParams(task="token_embed")})
    assert li.query_uses("k") == 2
    li.register_request("d2", doc("k"))  # registered: the finished path owns its release
    li.release_unscheduled({"d2": doc("k")})
    assert li.query_uses("k") == 2
    li.on_requests_finished(["d2"])
    assert li.query_uses("k") == 1


def test_release_of_a_dropped_key_is_a_no_op_and_clear_drops_everything():
    li = LateInteractionRunner()
    run(li, [("q", query("k", 3), vecs(3)), ("q2", query("k2", 1), vecs(3))])
    li.register_request("d", doc("k"))
    li.drop_queries(["k"])
    li.on_requests_finished(["d"])
    assert li.query_uses("k") is None and li.query_uses("k2") == 1
    li.register_request("d2", doc("k2"))
    li.clear()
    assert li.num_cached_queries == 0 and li.num_pending_docs == 0


# ---- the pooling runner composes it ----------------------------------------------------------
class _Pooler:
    def __init__(self, outputs):
        self.outputs = outputs

    def get_supported_tasks(self):
        return frozenset({"token_embed"})

    def __call__(self, hidden, metadata):
        return [self.outputs[r] for r in metadata.req_ids]


def _pooling_runner(outputs):
    config = SimpleNamespace(attn_type="encoder_only", selected_task="token_embed")
    return PoolingRunner(config, _Pooler(outputs))


def _metadata(req_ids, params):
    return SimpleNamespace(req_ids=req_ids, pooling_params=params)


def test_pooling_runner_add_request_registers_and_pool_postprocesses():
    q, d = vecs(3), vecs(4, seed=1)
    runner = _pooling_runner({"q": q, "d": d, "lost": d})
    runner.add_request("q", query("k", 1))
    outputs, errors = runner.pool(None, _metadata(["q"], [query("k", 1)]), [True])
    assert outputs[0].dim() == 0 and errors == {}
    runner.add_request("d", doc("k"))
    runner.add_request("lost", doc("nope"))
    outputs, errors = runner.pool(None, _metadata(["d", "lost"], [doc("k"), doc("nope")]),
                                  [True, True])
    assert float(outputs[0]) == pytest.approx(brute_maxsim(q, d), rel=1e-6)
    assert list(errors) == ["lost"]
    assert runner.late_interaction.num_cached_queries == 0


# ---- the model runner keeps the lifecycle ----------------------------------------------------
def _model_runner(uses=3):
    runner = object.__new__(ModelRunner)  # no model needed for request bookkeeping
    runner.pooling_runner = _pooling_runner({})
    runner.requests = {}
    li = runner.pooling_runner.late_interaction
    run(li, [("q", query("k", uses), vecs(3))])
    return runner, li


def _register(runner, *req_ids):
    for req_id in req_ids:
        runner.pooling_runner.add_request(req_id, doc("k"))
        runner.requests[req_id] = object()


def test_preempted_doc_keeps_its_reservation_until_rescheduled():
    runner, li = _model_runner()
    _register(runner, "d")
    runner.finish_requests(SchedulerOutput(preempted_req_ids={"d"}))
    assert li.query_uses("k") == 3 and "d" not in runner.requests
    _register(runner, "d")  # rescheduled: same id, same key
    _, errors = li.postprocess_pooler_output([vecs(2)], [doc("k")], ["d"], [True])
    assert errors == {} and li.query_uses("k") == 2
    runner.finish_requests(SchedulerOutput(finished_req_ids={"d"}))
    assert li.query_uses("k") == 2  # scored: not released twice


def test_finished_ids_reach_the_pooling_runner_before_preempted_ids_are_merged():
    runner, li = _model_runner()
    _register(runner, "done", "preempted")
    seen = []
    original = runner.pooling_runner.on_requests_finished
    runner.pooling_runner.on_requests_finished = lambda ids: (seen.append(set(ids)),
                                                              original(ids))
    runner.finish_requests(SchedulerOutput(finished_req_ids={"done"},
                                           preempted_req_ids={"preempted"}))
    assert seen == [{"done"}]                    # only finished ids are released
    assert li.query_uses("k") == 2               # "done" (unscored) released, "preempted" kept
    assert runner.requests == {}                 # both leave the runner's batch state


def test_preempted_then_aborted_doc_releases_once_through_the_finished_path():
    runner, li = _model_runner()
    _register(runner, "d")
    runner.finish_requests(SchedulerOutput(preempted_req_ids={"d"}))
    runner.finish_requests(SchedulerOutput(finished_req_ids={"d"}))  # aborted while waiting
    runner.finish_requests(SchedulerOutput(finished_req_ids={"d"}))
    assert li.query_uses("k") == 2


def test_unscheduled_aborted_docs_release_through_the_model_runner():
    runner, li = _model_runner()
    runner.finish_requests(SchedulerOutput(unscheduled_aborted={"a": doc("k"), "b": doc("k")}))
    assert li.query_uses("k") == 1
    runner.finish_requests(SchedulerOutput(unscheduled_aborted={"c": doc("k")}))
    assert li.num_cached_queries == 0
