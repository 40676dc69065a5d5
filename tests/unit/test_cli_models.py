"""`pooler serve` model selection: one model, several (--model repeated), or a TOML file."""
from __future__ import annotations

import argparse

import pytest

from pooler.cli.serve import add_parser, model_specs, read_models_config


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_one_two_and_default_models():
    assert model_specs(_args("a")) == [{"model": "a"}]
    assert model_specs(_args("--model", "a", "--model", "b")) == [{"model": "a"},
                                                                   {"model": "b"}]
    [default] = model_specs(_args())
    assert default["model"]


def test_models_config(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nmodel = "emb"\nname = "embedder"\n\n'
                    '[[models]]\nmodel = "ce"\ntask = "classify"\n')
    assert model_specs(_args("--models-config", str(path))) == [
        {"model": "emb", "name": "embedder"}, {"model": "ce", "task": "classify"}]
    with pytest.raises(ValueError, match="not both"):
        model_specs(_args("x", "--models-config", str(path)))
    path.write_text('[[models]]\nmodel = "emb"\nbatch = 3\n')
    with pytest.raises(ValueError, match=r"unknown keys \['batch'\]"):
        read_models_config(str(path))
    path.write_text('name = "x"\n')
    with pytest.raises(ValueError, match=r"one \[\[models\]\] table"):
        read_models_config(str(path))


def test_one_served_name_for_several_models_is_refused():
    with pytest.raises(ValueError, match="names one model"):
        model_specs(_args("--model", "a", "--model", "b", "--served-model-name", "x"))
