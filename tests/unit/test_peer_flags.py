"""`pooler serve` started as TEI and vLLM are: their flags, TEI's environment variables, a flag
beating its variable, and a clear refusal for what pooler cannot honour (parse level: no model
loads)."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from pooler.cli import peer_flags, serve
from pooler.cli.common import engine_kwargs
from pooler.cli.main import build_parser, main
from pooler.model_folder import SentenceTransformerLayout, STPooling

# Every variable the parser reads: cleared so the machine's environment cannot leak in.
VARIABLES = ("MODEL_ID", "PORT", "HOSTNAME", "PROMETHEUS_PORT", "JSON_OUTPUT", "CORS_ALLOW_ORIGIN",
             "API_KEY", "VLLM_API_KEY", "HF_TOKEN", "HF_API_TOKEN", *peer_flags.ENV_VALUES,
             *peer_flags.ENV_REFUSED)


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return set_


def parse(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(["serve", *argv])
    peer_flags.apply(args, environ={})
    return args


@pytest.fixture
def no_load(monkeypatch):
    """main(["serve", ...]) must fail before any model loads or port is bound."""
    def must_not_load(args):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(serve, "build_app", must_not_load)
    monkeypatch.setattr(serve, "check_port", lambda *a, **k: None)


def test_tei_flags_map_to_pooler_options(env):
    args = parse("--model-id", "BAAI/bge-small-en-v1.5", "--hostname", "0.0.0.0", "-p", "80",
                 "--max-concurrent-requests", "512", "--max-batch-tokens", "16384",
                 "--max-batch-requests", "64", "--max-client-batch-size", "32",
                 "--payload-limit", "2000000", "--json-output", "--api-key", "k",
                 "--auto-truncate", "--revision", "refs/pr/2", "--dtype", "float16")
    assert serve.model_specs(args) == [{"model": "BAAI/bge-small-en-v1.5"}]
    assert (args.host, args.port, args.log_format) == ("0.0.0.0", 80, "json")
    settings = serve._settings(args)
    assert (settings.max_queue, settings.max_input_items, settings.max_payload_bytes,
            settings.api_key, settings.log_requests) == (512, 32, 2000000, "k", True)
    kwargs = engine_kwargs(args)
    assert (kwargs["max_num_batched_tokens"], kwargs["max_num_seqs"], kwargs["revision"],
            kwargs["dtype"]) == (16384, 64, "refs/pr/2", "float16")


def test_tei_environment_as_a_kubernetes_manifest_sets_it(env):
    env(MODEL_ID="BAAI/bge-small-en-v1.5", PORT="80", MAX_CLIENT_BATCH_SIZE="64",
        MAX_CONCURRENT_REQUESTS="100", MAX_BATCH_TOKENS="4096", PAYLOAD_LIMIT="1000",
        API_KEY="secret", JSON_OUTPUT="true", PROMETHEUS_PORT="9000",
        OTLP_SERVICE_NAME="emb", SERVED_MODEL_NAME="bge", REVISION="main")
    args = parse()
    assert serve.model_specs(args) == [{"model": "BAAI/bge-small-en-v1.5"}]
    settings = serve._settings(args)
    assert (args.port, settings.max_input_items, settings.max_queue, settings.max_payload_bytes,
            settings.api_key, settings.log_requests, settings.prometheus_port,
            settings.otlp_service_name, settings.served_model_name) == \
        (80, 64, 100, 1000, "secret", True, 9000, "emb", "bge")
    assert engine_kwargs(args)["max_num_batched_tokens"] == 4096
    assert engine_kwargs(args)["revision"] == "main"


def test_a_flag_beats_its_variable(env):
    env(MODEL_ID="from-env", PORT="80", API_KEY="env-key", JSON_OUTPUT="true",
        MAX_CLIENT_BATCH_SIZE="64")
    args = parse("from-flag", "--port", "9001", "--api-key", "flag-key", "--log-format", "text",
                 "--max-client-batch-size", "8")
    assert serve.model_specs(args) == [{"model": "from-flag"}]
    assert (args.port, args.api_key, args.log_format, args.max_input_items) == \
        (9001, "flag-key", "text", 8)
    assert serve.model_specs(parse("--model-id", "id-flag")) == [{"model": "id-flag"}]
    # --models-config is a model choice too: MODEL_ID does not add to it
    assert parse("--models-config", "m.toml").model is None


def test_without_variables_pooler_keeps_its_defaults(env):
    args = parse()
    assert (args.host, args.port, args.api_key, args.log_format, args.max_input_items) == \
        ("127.0.0.1", 8000, None, "text", 4096)


@pytest.mark.parametrize("hostname, host", [("pooler-7d9c-xk2p", "127.0.0.1"),
                                            ("3f2a1b9c0d4e", "127.0.0.1"),
                                            ("10.1.2.3", "10.1.2.3"), ("::", "::"),
                                            ("0.0.0.0", "0.0.0.0")])
def test_hostname_is_used_only_when_it_is_an_address(env, hostname, host):
    env(HOSTNAME=hostname)  # Docker and Kubernetes set it to the container's or pod's name
    assert parse().host == host
    assert parse("--hostname", "127.0.0.1").host == "127.0.0.1"


def test_vllm_spelling(env):
    args = parse("BAAI/bge-reranker-base", "--runner", "pooling", "--convert", "classify",
                 "--max-model-len", "1k", "--served-model-name", "rr")
    kwargs = engine_kwargs(args)
    assert (kwargs["runner"], kwargs["task"], kwargs["max_model_len"]) == ("auto", "classify",
                                                                         1000)
    assert serve._settings(args).served_model_name == "rr"
    assert engine_kwargs(parse("--max-model-len", "2K"))["max_model_len"] == 2048
    assert "max_model_len" not in engine_kwargs(parse("--max-model-len", "auto"))
    assert engine_kwargs(parse("--convert", "auto"))["task"] is None
    args = parse("--pooler-config", '{"pooling_type": "MEAN", "enable_chunked_processing": true}')
    assert (args.pooling, args.long_input) == ("mean", "chunk")


def test_vllm_api_key_variable(env):
    env(VLLM_API_KEY="v")
    assert parse().api_key == "v"
    assert parse("--api-key", "flag").api_key == "flag"
    env(API_KEY="v")
    assert parse().api_key == "v"  # both set to the same key: fine


@pytest.mark.parametrize("argv, reason", [
    (["--tokenization-workers", "4"], "--max-workers"),
    (["--default-prompt", "query: "], "--default-prompt-name"),
    (["--dense-path", "2_Dense_768"], "modules.json"),
    (["--trust-remote-code"], "never runs code from a model repository"),
    (["--auto-truncate", "false"], "truncate: false"),
    (["--runner", "generate"], "pooling models only"),
    (["--convert", "reward"], "no reward"),
    (["--pooling", "max"], "invalid choice"),
])
def test_flags_pooler_cannot_honour_are_refused_with_the_reason(env, capsys, argv, reason):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", *argv])
    assert exit_.value.code == 2
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize("variables, reason", [
    ({"TOKENIZATION_WORKERS": "4"}, "TOKENIZATION_WORKERS is set in the environment"),
    ({"DEFAULT_PROMPT": "query: "}, "--default-prompt is not supported"),
    ({"AUTO_TRUNCATE": "false"}, "AUTO_TRUNCATE='false' in the environment"),
    ({"PORT": "http"}, "PORT='http' in the environment: 'http' is not a port number"),
    ({"PORT": "70000"}, "PORT='70000'"),
    ({"MAX_CLIENT_BATCH_SIZE": "0"}, "MAX_CLIENT_BATCH_SIZE='0' in the environment: 0 must"),
    ({"JSON_OUTPUT": "maybe"}, "JSON_OUTPUT='maybe' in the environment: 'maybe' is not a boolean"),
    ({"POOLING": "max"}, "POOLING='max'"),
    ({"API_KEY": "a", "VLLM_API_KEY": "b"}, "API_KEY and VLLM_API_KEY are both set"),
])
def test_bad_or_refused_variables_stop_pooler_serve_only(env, no_load, capsys, variables, reason):
    env(**variables)
    assert main(["serve"]) == 2
    assert reason in capsys.readouterr().err
    build_parser().parse_args(["embed", "x"])  # other subcommands do not read them


def test_secret_values_are_not_echoed(env, no_load, capsys):
    env(API_KEY="sk-do-not-print", VLLM_API_KEY="other")
    assert main(["serve"]) == 2
    assert "sk-do-not-print" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, reason", [
    (["a", "--model-id", "b"], "give it once"),
    (["--task", "embed", "--convert", "classify"], "disagree"),
    (["--pooler-config", '{"normalize": false}'], "the `normalize` field"),
    (["--pooler-config", '{"pooling_type": "ALL"}'], "token_embed"),
    (["--pooler-config", '{"step_tag_id": 3}'], "not supported"),
    (["--model", "a", "--model", "b", "--pooling", "mean"], "one model"),
    (["--ray", "--default-prompt-name", "query"], "without --ray"),
])
def test_combinations_pooler_cannot_honour(env, argv, reason):
    with pytest.raises(ValueError, match=reason):
        parse(*argv)


def test_hub_cache_and_token_reach_huggingface_hub(env, monkeypatch, tmp_path):
    from pooler import hub

    args = build_parser().parse_args(["serve", "--huggingface-hub-cache", str(tmp_path),
                                      "--hf-token", "hf_x"])
    environ: dict[str, str] = {}
    peer_flags.apply(args, environ=environ)
    assert environ == {"HF_HUB_CACHE": str(tmp_path), "HF_TOKEN": "hf_x"}
    # TEI's images set the older name, which huggingface_hub also reads
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path))
    assert hub.hub_cache_dir() == tmp_path


def _model(mode="mean", prompts=None, head="embed", tasks=("embed",)):
    st = SentenceTransformerLayout(pooling=STPooling(mode=mode, include_prompt=True),
                                   prompts=dict(prompts or {}))
    return SimpleNamespace(st=st, head=head, model_tasks=frozenset(tasks),
                           architecture="BertModel", decoder_family=False, attn_type="encoder_only")


def test_pooling_is_accepted_only_when_it_is_the_models():
    peer_flags.check_pooling(_model("mean"), "mean")
    peer_flags.check_pooling(_model("lasttoken"), "last-token")
    with pytest.raises(ValueError, match="pools with cls"):
        peer_flags.check_pooling(_model("cls"), "mean")
    with pytest.raises(ValueError, match="ForMaskedLM"):
        peer_flags.check_pooling(_model(), "splade")
    peer_flags.check_pooling(_model(head="mlm", tasks=("token_classify",)), "splade")


def test_default_prompt_name_must_be_declared():
    model = _model(prompts={"query": "query: ", "document": ""})
    peer_flags.set_default_prompt(model, "query")
    assert model.st.default_prompt_name == "query"
    with pytest.raises(ValueError, match=r"not among the model's prompts \['document', 'query'\]"):
        peer_flags.set_default_prompt(model, "passage")
    with pytest.raises(ValueError, match="declares no prompts"):
        peer_flags.set_default_prompt(_model(), "query")


def test_cors_allow_origin_answers_a_preflight(env, minilm_engine):
    from fastapi.testclient import TestClient

    from pooler.server.app import create_app

    env(CORS_ALLOW_ORIGIN="https://a.example, https://b.example")
    args = parse()
    app = create_app(minilm_engine, serve._settings(args), owns_engine=False)
    peer_flags.after_build(app, args)
    client = TestClient(app)
    ok = client.options("/embed", headers={"Origin": "https://b.example",
                                           "Access-Control-Request-Method": "POST"})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "https://b.example"
    other = client.options("/embed", headers={"Origin": "https://evil.example",
                                              "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers
