"""What a newcomer hits in the first hour: a task the model lacks, a GPU that is not there, a
port in use, a server exposed without a key. Each says what to do in user words."""
from __future__ import annotations

import logging
import socket
import subprocess
import sys

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


def test_serve_checks_the_port_before_importing_torch():
    """The port-in-use check runs before torch is imported (the import alone takes seconds),
    so a fresh interpreter shows it; the model is never loaded."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        probe = ("import sys; from pooler.cli.main import main; "
                 f"rc = main(['serve', '--port', '{port}']); "
                 "print(rc, 'torch' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Another server is using the port" in done.stderr and "--port" in done.stderr


@pytest.mark.parametrize("port", ["99999", "-1", "0", "http"])
def test_serve_port_out_of_range_is_an_argparse_error(port, capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--port", port])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --port" in err and "1-65535" in err and "Traceback" not in err


def test_serve_names_a_host_that_does_not_resolve(monkeypatch, capsys):
    monkeypatch.setattr(serve, "build_app", _must_not_load)
    assert main(["serve", "--host", "nosuchhost.invalid", "--port", "8000"]) == 2
    err = capsys.readouterr().err
    assert "the host 'nosuchhost.invalid' does not resolve" in err
    assert "--host" in err and "Another server" not in err


def test_serve_names_an_address_this_machine_lacks(monkeypatch, capsys):
    monkeypatch.setattr(serve, "build_app", _must_not_load)
    # TEST-NET-1 (RFC 5737): documentation-only, never assigned to an interface
    assert main(["serve", "--host", "192.0.2.1", "--port", "8000"]) == 2
    err = capsys.readouterr().err
    assert "No interface of this machine has the address 192.0.2.1" in err


def _must_not_load(args):
    raise AssertionError("the model was loaded before the address was checked")


def test_exposed_host_without_api_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pooler.serve"):
        serve.warn_if_exposed("0.0.0.0", None)
    assert "without --api-key" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pooler.serve"):
        serve.warn_if_exposed("0.0.0.0", "secret")
        serve.warn_if_exposed("127.0.0.1", None)
    assert caplog.text == ""


def test_serve_checks_the_grpc_and_prometheus_ports_too(monkeypatch, capsys):
    monkeypatch.setattr(serve, "build_app", _must_not_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", "18123", "--grpc-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--grpc-port" in err
    assert main(["serve", "--port", "18123", "--prometheus-port", "18123"]) == 2
    assert "--prometheus-port 18123 is the HTTP --port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--grpc-port", "70000"])
    assert "argument --grpc-port" in capsys.readouterr().err
