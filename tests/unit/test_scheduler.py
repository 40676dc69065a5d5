"""Scheduler: token budget, max_num_seqs, order, priority, abort, failure isolation."""
import random

import pytest

from pooler.config import SchedulerConfig
from pooler.engine.request import Request, RequestStatus
from pooler.engine.scheduler import Scheduler
from pooler.step_contract import ModelRunnerOutput
from pooler.params import PoolingParams


def _req(rid, n, priority=0):
    return Request(rid, list(range(n)), PoolingParams(task="embed"), priority=priority)


def _ok(out):
    ids = [r.req_id for r in out.scheduled_new_reqs]
    return ModelRunnerOutput(req_ids=ids, pooler_outputs=[rid for rid in ids])


def _drain(sched):
    order, batches = [], []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        batches.append(out)
        for r in sched.update_from_output(out, _ok(out)):
            order.append(r.request_id)
    return order, batches


def test_token_budget_and_max_seqs_never_exceeded():
    rng = random.Random(0)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=4))
    for i in range(200):
        sched.add_request(_req(f"r{i}", rng.randint(1, 100)))
    order, batches = _drain(sched)
    assert sorted(order) == sorted(f"r{i}" for i in range(200))
    for b in batches:
        assert b.total_num_scheduled_tokens <= 100
        assert len(b.scheduled_new_reqs) <= 4
        assert b.total_num_scheduled_tokens == sum(b.num_scheduled_tokens.values())


def test_fcfs_order_preserved():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=2))
    for i in range(9):
        sched.add_request(_req(f"r{i}", 3))
    order, _ = _drain(sched)
    assert order == [f"r{i}" for i in range(9)]


def test_priority_honoured_then_arrival():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=1))
    sched.add_request(_req("low", 3, priority=5))
    sched.add_request(_req("high-1", 3, priority=-1))
    sched.add_request(_req("mid", 3, priority=0))
    sched.add_request(_req("high-2", 3, priority=-1))
    order, _ = _drain(sched)
    assert order == ["high-1", "high-2", "mid", "low"]


def test_head_of_line_is_not_skipped_by_a_smaller_later_request():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=8))
    sched.add_request(_req("a", 6))
    sched.add_request(_req("b", 6))
    sched.add_request(_req("c", 1))
    out = sched.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["a"]


def test_too_long_request_is_rejected_at_add():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10))
    with pytest.raises(ValueError, match="more than max_num_batched_tokens=10"):
        sched.add_request(_req("big", 11))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(_req("x", 1))
        sched.add_request(_req("x", 1))


def test_abort_waiting_request_is_reported_as_unscheduled():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=1))
    sched.add_request(_req("a", 2))
    sched.add_request(_req("b", 2))
    assert sched.abort_requests(["b", "missing"]) == ["b"]
    out = sched.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["a"]
    assert "b" in out.unscheduled_aborted and "b" not in out.finished_req_ids
    sched.update_from_output(out, _ok(out))
    nxt = sched.schedule()
    assert nxt.finished_req_ids == {"a"} and not nxt.scheduled_new_reqs
    assert not sched.has_unfinished_requests()


def test_failing_batch_is_bisected_and_preempted():
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=8))
    for i in range(4):
        sched.add_request(_req(f"r{i}", 2))
    out = sched.schedule()
    assert len(out.scheduled_new_reqs) == 4
    assert sched.update_from_output(out, ModelRunnerOutput(batch_error="boom")) == []
    retry = sched.schedule()
    assert retry.preempted_req_ids == {"r0", "r1", "r2", "r3"}
    assert [r.req_id for r in retry.scheduled_new_reqs] == ["r0", "r1"]
    results = {}
    while sched.has_unfinished_requests():
        ids = [r.req_id for r in retry.scheduled_new_reqs]
        runner_out = ModelRunnerOutput(batch_error="boom") if "r1" in ids else _ok(retry)
        for r in sched.update_from_output(retry, runner_out):
            results[r.request_id] = r
        retry = sched.schedule()
    assert results["r1"].status == RequestStatus.FAILED and "boom" in results["r1"].error
    assert all(results[r].status == RequestStatus.FINISHED for r in ("r0", "r2", "r3"))


def test_default_token_budget_follows_the_device():
    """CPU steps stay small (activations in cache); CUDA steps are large enough to fill the
    GPU; a model longer than the budget raises it to one whole sequence."""
    from types import SimpleNamespace

    import torch

    def model(device: str, max_len: int):
        return SimpleNamespace(torch_device=torch.device(device), max_model_len=max_len)

    assert SchedulerConfig.for_model(model("cpu", 512)).max_num_batched_tokens == 2048
    assert SchedulerConfig.for_model(model("cuda", 512)).max_num_batched_tokens == 16384
    assert SchedulerConfig.for_model(model("cpu", 8192)).max_num_batched_tokens == 8192
    assert SchedulerConfig.for_model(model("cuda", 512), 300).max_num_batched_tokens == 300
