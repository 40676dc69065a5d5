"""How `pooler serve --ray` options become a Serve deployment (no cluster needed)."""
from __future__ import annotations

import pytest

pytest.importorskip("ray")

from pooler.cli.main import main  # noqa: E402
from pooler.ray.serve import app_builder, parse_autoscale, serve_app  # noqa: E402


def _deployment(app):
    return app._bound_deployment


def test_replicas_and_resources():
    d = _deployment(serve_app("some/model", replicas=3, num_cpus=2, engine_kwargs={
        "dtype": "float32", "num_threads": None}))
    assert d.num_replicas == 3
    assert d.ray_actor_options["num_cpus"] == 2
    engine_kwargs, settings = d.init_args
    assert engine_kwargs == {"model": "some/model", "dtype": "float32", "num_threads": 2}


def test_autoscale_on_ongoing_requests():
    d = _deployment(app_builder({"model": "m", "autoscale": "1,4", "num_gpus": "1"}))
    config = d._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas) == (1, 4)
    assert config.target_ongoing_requests == 16
    assert d.ray_actor_options["num_gpus"] == 1
    assert d.init_args[0]["device"] == "cuda"


@pytest.mark.parametrize("text", ["4", "a,b", "1,2,3"])
def test_bad_autoscale_is_a_clear_error(text):
    with pytest.raises(ValueError, match="--autoscale takes MIN,MAX"):
        parse_autoscale(text)


def test_cli_rejects_inverted_autoscale(capsys):
    assert main(["serve", "m", "--ray", "--autoscale", "3,1"]) == 2
    assert "0 <= MIN <= MAX" in capsys.readouterr().err
