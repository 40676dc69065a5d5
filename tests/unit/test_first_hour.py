"""What a newcomer hits in the first hour: a task the model lacks, a GPU that is not there, a
port in use, a server exposed without a key. Each says what to do in user words."""
from __future__ import annotations

import logging
import socket
import time

import pytest
import torch

from pooler.cli import serve
from pooler.cli.main import main


def test_ner_on_an_embedder_names_the_model_kind(minilm_engine):
    with pytest.raises(ValueError) as info:
        minilm_engine.ner("Ada Lovelace lived in London")
    message = str(info.value)
    assert message.startswith("Unsupported task: 'token_classify'")  # vLLM's wording first
    assert "named-entity recognition" in message.lower()
    assert "*ForTokenClassification" in message and "sentence embedder" in message
    assert "--model PATH" in message
    with pytest.raises(ValueError, match="sequence-classification model"):
        minilm_engine.classify("great film")


def test_pooler_ner_without_model_says_to_pass_one(capsys):
    assert main(["ner", "Ada Lovelace lived in London"]) == 2
    err = capsys.readouterr().err
    assert "token-classification model" in err and "pooler ner --model PATH" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_cuda_on_cpu_only_torch_is_a_clear_error():
    from pooler import Engine

    with pytest.raises(ValueError, match="device='cuda' was asked for.*device='cpu'"):
        Engine(device="cuda")
    with pytest.raises(ValueError, match="'auto', 'cpu', 'cuda'"):
        Engine(device="tpu")


def test_serve_checks_the_port_before_loading_the_model(monkeypatch, capsys):
    def must_not_load(args):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(serve, "build_app", must_not_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.perf_counter()
        assert main(["serve", "--port", str(port)]) == 2
    assert time.perf_counter() - started < 5
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


def test_exposed_host_without_api_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pooler.serve"):
        serve.warn_if_exposed("0.0.0.0", None)
    assert "without --api-key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pooler.serve"):
        serve.warn_if_exposed("0.0.0.0", "secret")
        serve.warn_if_exposed("127.0.0.1", None)
    assert caplog.text == ""
