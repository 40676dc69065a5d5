"""The operating flags' edges, without a server: a missing `ops` package is an error naming
the extra, ports are checked, and the extra listeners refuse setups with several apps."""
from __future__ import annotations

import pytest

from pooler.cli.main import build_parser
from pooler.server.settings import ServerSettings, require_ops_extra


def test_a_missing_package_names_the_extra():
    with pytest.raises(ValueError, match=r"--grpc-port needs no_such_pkg\.sub \(pooler's \[ops\] "
                                         r"extra\): .* -m pip install "):
        require_ops_extra("--grpc-port", ("grpc", "no_such_pkg.sub"))


def test_ports_must_be_tcp_ports():
    with pytest.raises(ValueError, match="grpc_port must be a TCP port"):
        ServerSettings(grpc_port=70000)
    with pytest.raises(ValueError, match="prometheus_port must be a TCP port"):
        ServerSettings(prometheus_port=-1)


def test_serve_flags_reach_the_settings():
    from pooler.cli.serve import _settings

    args = build_parser().parse_args([
        "serve", "m", "--host", "0.0.0.0", "--prometheus-port", "9000", "--grpc-port", "50051",
        "--otlp-endpoint", "http://127.0.0.1:4317", "--otlp-service-name", "emb",
        "--log-format", "json"])
    s = _settings(args)
    assert (s.prometheus_port, s.grpc_port, s.listen_host) == (9000, 50051, "0.0.0.0")
    assert (s.otlp_endpoint, s.otlp_service_name, s.log_requests) == \
        ("http://127.0.0.1:4317", "emb", True)
    assert _settings(build_parser().parse_args(["serve", "m"])).log_requests is False


def test_extra_listeners_refuse_several_models():
    from pooler.cli.serve import build_app

    args = build_parser().parse_args(["serve", "--model", "a", "--model", "b",
                                      "--grpc-port", "50051"])
    with pytest.raises(ValueError, match="--grpc-port serves one model's app"):
        build_app(args)
