"""The pooling runner's task-gating contract, with a fake model config and pooler."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pooler.params import PoolingParams
from pooler.worker.pooling_runner import PoolingRunner


class FakePooler:
    def __init__(self, tasks):
        self.tasks = frozenset(tasks)

    def get_supported_tasks(self):
        return self.tasks


def make_runner(attn_type: str, model_tasks, selected: str) -> PoolingRunner:
    config = SimpleNamespace(attn_type=attn_type, selected_task=selected)
    return PoolingRunner(config, FakePooler(model_tasks))


def test_task_sets_are_exact():
    assert PoolingRunner._SUPPORTED_TASKS == {"embed", "classify", "token_embed",
                                              "token_classify"}
    assert PoolingRunner._TOKEN_TASKS == {"token_embed", "token_classify"}
    encoder = SimpleNamespace(attn_type="encoder_only")
    decoder = SimpleNamespace(attn_type="decoder")
    assert PoolingRunner._get_enabled_tasks(encoder) == PoolingRunner._SUPPORTED_TASKS
    assert PoolingRunner._get_enabled_tasks(decoder) == {"embed", "classify"}


@pytest.mark.parametrize("token_task", ["token_classify", "token_embed"])
def test_encoder_only_model_supports_token_task(token_task):
    runner = make_runner("encoder_only", {token_task}, token_task)
    assert runner.supported_tasks == {token_task}
    assert runner.selected_task == token_task
    runner.add_request("r0", PoolingParams(task=token_task))
    assert "r0" in runner.request_params


@pytest.mark.parametrize("token_task", ["token_classify", "token_embed"])
def test_decoder_selecting_token_task_is_rejected_without_explicit_task_hint(token_task):
    with pytest.raises(ValueError) as info:
        make_runner("decoder", {token_task}, token_task)
    message = str(info.value)
    assert "enabled tasks ['classify', 'embed']" in message
    assert f"selected task '{token_task}'" in message
    assert f"model tasks ['{token_task}']" in message
    assert "explicitly supported task" not in message
    assert "runner='transformers'" in message


@pytest.mark.parametrize("token_task", ["token_classify", "token_embed"])
def test_decoder_declaring_embed_and_token_task_gets_embed_only(token_task):
    runner = make_runner("decoder", {"embed", token_task}, "embed")
    assert runner.supported_tasks == {"embed"}
    with pytest.raises(ValueError, match=rf"Unsupported task: '{token_task}'. "
                                         r"Supported tasks: \['embed'\]"):
        runner.add_request("r0", PoolingParams(task=token_task))


@pytest.mark.parametrize("token_task", ["token_classify", "token_embed"])
def test_decoder_selecting_token_task_with_embed_available_suggests_explicit_task(token_task):
    with pytest.raises(ValueError) as info:
        make_runner("decoder", {"embed", token_task}, token_task)
    assert "Set an explicitly supported task: task='embed'" in str(info.value)


def test_empty_supported_set_is_an_error():
    # Selected task enabled but the pooler offers nothing enabled.
    with pytest.raises(ValueError, match="supports none of the enabled tasks"):
        make_runner("decoder", {"token_embed"}, "embed")


def test_finished_requests_are_forgotten():
    runner = make_runner("encoder_only", {"embed"}, "embed")
    runner.add_request("a", PoolingParams(task="embed"))
    runner.on_requests_finished({"a", "never-added"})
    assert runner.request_params == {}
