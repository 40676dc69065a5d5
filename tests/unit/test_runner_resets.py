"""The runners' reset contract: reset_encoder_cache is the one entry that clears late-interaction
state; reset_mm_cache never does; every way of changing weights goes through both resets."""
from __future__ import annotations

import inspect

import pytest

from pooler.config import ModelConfig
from pooler.worker.model_runner import ModelRunner
from pooler.worker.transformers_runner import TransformersRunner
from tests.models.tiny import save_tiny_bert

RUNNERS = {"native": ModelRunner, "transformers": TransformersRunner}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, minilm_path):
    return save_tiny_bert(tmp_path_factory.mktemp("resets") / "bert", minilm_path, seed=3)


@pytest.fixture(scope="module", params=sorted(RUNNERS))
def runner(request, tiny_folder):
    return RUNNERS[request.param](ModelConfig(str(tiny_folder), runner=request.param,
                                              device="cpu"))


class _Spy:
    """Counts calls of `obj.name` (instance attribute wrapper, original still runs)."""

    def __init__(self, monkeypatch, obj, name):
        self.calls = 0
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(obj, name, wrapper)


def test_reset_mm_cache_does_not_clear_late_interaction(runner, monkeypatch):
    clear = _Spy(monkeypatch, runner.pooling_runner, "clear")
    runner.reset_mm_cache()
    assert clear.calls == 0


def test_reset_encoder_cache_clears_late_interaction_exactly_once(runner, monkeypatch):
    clear = _Spy(monkeypatch, runner.pooling_runner, "clear")
    runner.reset_encoder_cache()
    assert clear.calls == 1


def test_reload_weights_goes_through_both_resets(runner, monkeypatch):
    encoder = _Spy(monkeypatch, runner, "reset_encoder_cache")
    mm = _Spy(monkeypatch, runner, "reset_mm_cache")
    clear = _Spy(monkeypatch, runner.pooling_runner, "clear")
    runner.reload_weights()
    assert (encoder.calls, mm.calls, clear.calls) == (1, 1, 1)


def _weight_loads(runner, monkeypatch) -> _Spy:
    """A spy on the primitive each runner loads weights with."""
    if isinstance(runner, TransformersRunner):
        return _Spy(monkeypatch, runner, "_load_model")
    import pooler.worker.model_runner as module
    spy = _Spy(monkeypatch, module, "load_weights_into")
    build = getattr(module, "build_model")

    def counting_build(*args, **kwargs):
        spy.calls += 1
        return build(*args, **kwargs)
    monkeypatch.setattr(module, "build_model", counting_build)
    return spy


def _public_methods(cls) -> dict[str, inspect.Signature]:
    out = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or isinstance(inspect.getattr_static(cls, name), property):
            continue
        if callable(member):
            out[name] = inspect.signature(member)
    return out


def test_every_weight_changing_method_passes_through_reset_encoder_cache(runner, monkeypatch):
    """Calls every public no-argument method of the runner; each one that loads weights must
    call reset_encoder_cache. A new method that touches weights and takes arguments fails here
    until a case is written for it."""
    kind = type(runner).__name__
    methods = _public_methods(type(runner))
    weighty = [n for n in methods if "weight" in n or "load" in n or "swap" in n]
    assert "reload_weights" in weighty
    loaded_by = []
    for name, signature in methods.items():
        required = [p for p in list(signature.parameters.values())[1:]
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if required:
            assert name not in weighty, f"{name} takes arguments: add a case for it here"
            continue
        with monkeypatch.context() as m:
            loads = _weight_loads(runner, m)
            resets = _Spy(m, runner, "reset_encoder_cache")
            getattr(runner, name)()
            if loads.calls:
                loaded_by.append(name)
                assert resets.calls >= 1, f"{kind}.{name} loads weights without " \
                                          "reset_encoder_cache"
    assert "reload_weights" in loaded_by  # the spy can see a load: this test can fail
