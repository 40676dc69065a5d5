"""`pooler serve` as TEI's and vLLM's users already start their servers.

TEI (`text-embeddings-router`): its flag names, each also read from its environment variable
(the flag's upper-snake name: MODEL_ID, PORT, MAX_CLIENT_BATCH_SIZE, API_KEY, JSON_OUTPUT, ...);
a flag beats its variable, as clap's `env` does. vLLM (`vllm serve`): `--runner pooling`,
`--convert`, `--pooler-config`, `--max-model-len`, VLLM_API_KEY. Each maps onto the pooler
option that means the same (docs/operating/deploy.md has the table). A flag or variable
pooler cannot honour stops the server with the reason; none is silently dropped.

The variables are read when the parser is built (they become the options' defaults, so a flag
given on the command line wins); a variable with a bad value is reported when `pooler serve`
runs (`apply`), so other subcommands and `--help` still work.
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import logging
import os
from typing import Any, Callable, Mapping

from pooler.switch_words import is_off, is_on

logger = logging.getLogger("pooler.serve")


# What a TEI or vLLM option cannot do in pooler, and what to do instead.
REFUSED = {
    "--tokenization-workers": (
        "pooler tokenizes on the threads that serve requests (--max-workers, which also bounds "
        "how many requests wait on the engine at once), so a small tokenizer pool would cap "
        "concurrency. Drop it; tune --max-workers if needed."),
    "--default-prompt": (
        "pooler prepends only prompts the model declares (config_sentence_transformers.json "
        "`prompts`). Use --default-prompt-name NAME, or have clients send `prompt_name`."),
    "--dense-path": (
        "pooler reads the Dense modules modules.json lists (2_Dense, 2_Dense_<dims>, ...). "
        "Serve a copy of the model folder whose modules.json points at the Dense folder you "
        "want."),
    "--trust-remote-code": (
        "pooler never runs code from a model repository. The remote-code families it serves "
        "(Jina, Nomic, GTE, ...) are read natively from their weights without it; other "
        "architectures are refused with their name. Drop the flag."),
}
AUTO_TRUNCATE_OFF = (
    "pooler always truncates a TEI request that leaves `truncate` unset (TEI >= 1.9's "
    "default); a client that wants over-long inputs refused sends `truncate: false` (422).")


class Refuse(argparse.Action):
    """A peer's flag pooler cannot honour: the parse stops with the reason."""

    def __call__(self, parser, namespace, values, option_string=None):
        reason = REFUSED[self.option_strings[0]]
        parser.error(f"{option_string} is not supported by pooler: {reason}")


def parse_bool(text: str) -> bool:
    if is_on(text):
        return True
    if is_off(text):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false, 1/0, yes/no, on/off)")


def auto_truncate(text: str) -> bool:
    if not parse_bool(text):
        raise argparse.ArgumentTypeError(f"false is not supported: {AUTO_TRUNCATE_OFF}")
    return True


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def model_len(text: str) -> int | None:
    """vLLM's --max-model-len: 512, 1k (1000), 1K (1024), 25.6k; -1 or auto: the model's."""
    value = text.strip()
    if value.lower() in ("auto", "-1"):
        return None
    multipliers = {"k": 10**3, "m": 10**6, "K": 2**10, "M": 2**20}
    number, suffix = (value[:-1], value[-1]) if value[-1:] in multipliers else (value, "")
    try:
        if suffix in ("K", "M"):  # binary multipliers take whole numbers only, as vLLM's
            length = int(number) * multipliers[suffix]
        else:
            length = int(float(number) * multipliers[suffix]) if suffix else int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a length (512, 1k, 1K, 25.6k, or auto)") from None
    if length <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the length must be positive")
    return length


def convert(text: str) -> str:
    """vLLM's --convert: which pooling head a model is served with."""
    if text == "reward":
        raise argparse.ArgumentTypeError(
            "reward is not supported: pooler has no reward (per-token score) task; serve a "
            "classifier with --convert classify or --task classify")
    if text not in ("auto", "none", "embed", "classify"):
        raise argparse.ArgumentTypeError(f"{text!r}: choose auto, none, embed or classify")
    return text


POOLING_CHOICES = ("cls", "mean", "splade", "last-token")


def pooling_choice(text: str) -> str:
    if text not in POOLING_CHOICES:
        raise argparse.ArgumentTypeError(f"{text!r}: choose {', '.join(POOLING_CHOICES)}")
    return text


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object ({...})")
    return value


def ip_address(text: str) -> str:
    ipaddress.ip_address(text.strip("[]"))  # ValueError for names (a pod's name, say)
    return text.strip("[]")


def add(parser: argparse.ArgumentParser, port_number: Callable[[str], int]) -> None:
    """TEI's and vLLM's spellings. Options pooler already has under TEI's name (--port,
    --api-key, --revision, --dtype, --served-model-name, --otlp-*, --prometheus-port) keep
    theirs; aliases share the pooler option's destination."""
    S = argparse.SUPPRESS
    tei = parser.add_argument_group(
        "TEI's spelling (text-embeddings-router); each also reads its environment variable "
        "[env: NAME], a flag beats its variable (docs/operating/deploy.md). pooler's own "
        "options with TEI's names read theirs too: --port PORT, --api-key API_KEY (or "
        "vLLM's VLLM_API_KEY), --revision REVISION, --dtype DTYPE, "
        "--served-model-name SERVED_MODEL_NAME, --otlp-endpoint OTLP_ENDPOINT, "
        "--otlp-service-name OTLP_SERVICE_NAME, --prometheus-port PROMETHEUS_PORT")
    tei.add_argument("--model-id", default=None, metavar="MODEL",
                     help="the model, as MODEL [env: MODEL_ID]")
    tei.add_argument("--hostname", dest="host", default=S,
                     help="as --host [env: HOSTNAME, used only when it is an IP address: "
                          "containers set it to their own name]")
    tei.add_argument("-p", dest="port", type=port_number, default=S, help="as --port [env: PORT]")
    tei.add_argument("--max-concurrent-requests", dest="max_queue", type=positive_int, default=S,
                     help="as --max-queue: inputs in flight, each input of a batch counted as "
                          "TEI counts it; more are refused (TEI routes: 429) "
                          "[env: MAX_CONCURRENT_REQUESTS]")
    tei.add_argument("--max-batch-tokens", dest="max_num_batched_tokens", type=positive_int,
                     default=S, help="as --max-num-batched-tokens [env: MAX_BATCH_TOKENS]")
    tei.add_argument("--max-batch-requests", dest="max_num_seqs", type=positive_int, default=S,
                     help="as --max-num-seqs [env: MAX_BATCH_REQUESTS]")
    tei.add_argument("--max-client-batch-size", dest="max_input_items", type=positive_int,
                     default=S, help="as --max-input-items [env: MAX_CLIENT_BATCH_SIZE]")
    tei.add_argument("--payload-limit", dest="max_payload_bytes", type=positive_int, default=S,
                     help="as --max-payload-bytes [env: PAYLOAD_LIMIT]")
    tei.add_argument("--json-output", dest="log_format", action="store_const", const="json",
                     default=S, help="as --log-format json [env: JSON_OUTPUT]")
    tei.add_argument("--auto-truncate", nargs="?", const="true", type=auto_truncate, default=None,
                     metavar="true",
                     help="on, as in TEI >= 1.9; false is refused (pooler cannot turn it off) "
                          "[env: AUTO_TRUNCATE]")
    tei.add_argument("--pooling", default=None, choices=POOLING_CHOICES,
                     help="accepted when it is the pooling the model declares (its "
                          "1_Pooling/config.json; splade: a *ForMaskedLM model); pooler cannot "
                          "change a model's pooling, so another value is refused [env: POOLING]")
    tei.add_argument("--default-prompt-name", default=None, metavar="NAME",
                     help="the model's declared prompt added to inputs that name none "
                          "[env: DEFAULT_PROMPT_NAME]")
    tei.add_argument("--hf-token", "--hf-api-token", dest="hf_token", default=None,
                     help="Hugging Face token for gated or private models "
                          "[env: HF_TOKEN, HF_API_TOKEN]")
    tei.add_argument("--huggingface-hub-cache", default=None, metavar="DIR",
                     help="where hub models are cached [env: HUGGINGFACE_HUB_CACHE, "
                          "HF_HUB_CACHE, HF_HOME]")
    tei.add_argument("--uds-path", default=None, metavar="PATH",
                     help="accepted and unused: TEI's socket between its router and its Python "
                          "backend; pooler is one process [env: UDS_PATH]")
    tei.add_argument("--disable-spans", action="store_true",
                     help="accepted: pooler's log lines carry no span fields [env: DISABLE_SPANS]")
    tei.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                     help="answer browsers' CORS requests from this origin (repeat it; * for "
                          "any); off by default [env: CORS_ALLOW_ORIGIN, comma-separated]")
    for flag in ("--tokenization-workers", "--default-prompt", "--dense-path"):
        tei.add_argument(flag, action=Refuse, help="refused: " + REFUSED[flag])

    vllm = parser.add_argument_group(
        "vLLM's spelling (vllm serve); --runner pooling is --runner auto [env: VLLM_API_KEY "
        "as --api-key]")
    vllm.add_argument("--convert", type=convert, default=None,
                      help="embed or classify: as --task; auto/none: the model's own task")
    vllm.add_argument("--pooler-config", type=json_object, default=None, metavar="JSON",
                      help="vLLM's PoolerConfig: pooling_type (as --pooling) and "
                           "enable_chunked_processing (as --long-input chunk); per-request "
                           "fields (normalize, dimensions, use_activation, ...) are refused "
                           "with the request field to use")
    vllm.add_argument("--max-model-len", type=model_len, default=None,
                      help="longest input in tokens (512, 1k, 1K; auto: the model's)")
    vllm.add_argument("--trust-remote-code", nargs=0, action=Refuse,
                      help="refused: " + REFUSED["--trust-remote-code"])
    parser.set_defaults(**environment_defaults(os.environ, port_number))


# ---- the environment ---------------------------------------------------------------------
# TEI's variable -> (the option's destination, how its text becomes a value).
ENV_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "REVISION": ("revision", str),
    "DTYPE": ("dtype", str),
    "SERVED_MODEL_NAME": ("served_model_name", str),
    "POOLING": ("pooling", lambda text: pooling_choice(text)),
    "MAX_CONCURRENT_REQUESTS": ("max_queue", positive_int),
    "MAX_BATCH_TOKENS": ("max_num_batched_tokens", positive_int),
    "MAX_BATCH_REQUESTS": ("max_num_seqs", positive_int),
    "MAX_CLIENT_BATCH_SIZE": ("max_input_items", positive_int),
    "AUTO_TRUNCATE": ("auto_truncate", auto_truncate),
    "DEFAULT_PROMPT_NAME": ("default_prompt_name", str),
    "PAYLOAD_LIMIT": ("max_payload_bytes", positive_int),
    "OTLP_ENDPOINT": ("otlp_endpoint", str),
    "OTLP_SERVICE_NAME": ("otlp_service_name", str),
    "UDS_PATH": ("uds_path", str),
    "DISABLE_SPANS": ("disable_spans", parse_bool),
}
ENV_REFUSED = {"TOKENIZATION_WORKERS": "--tokenization-workers",
               "DEFAULT_PROMPT": "--default-prompt", "DENSE_PATH": "--dense-path"}
SECRETS = ("API_KEY", "VLLM_API_KEY", "HF_TOKEN", "HF_API_TOKEN")


def environment_defaults(environ: Mapping[str, str],
                         port_number: Callable[[str], int]) -> dict[str, Any]:
    """The options' defaults from TEI's (and vLLM's) variables, plus `peer_env_errors` (bad
    or refused values, raised by `apply`) and `peer_env_used` (the names, for one log line)."""
    values: dict[str, Any] = {}
    errors: list[str] = []
    used: list[str] = []

    def take(name: str, dest: str, parse: Callable[[str], Any]) -> None:
        text = environ.get(name)
        if text is None or text == "":
            return
        try:
            values[dest] = parse(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            shown = "(set)" if name in SECRETS else repr(text)
            errors.append(f"{name}={shown} in the environment: {exc}")
            return
        used.append(name)

    take("MODEL_ID", "env_model_id", str)
    take("PORT", "port", port_number)
    take("PROMETHEUS_PORT", "prometheus_port", port_number)
    for name, (dest, parse) in ENV_VALUES.items():
        take(name, dest, parse)
    take("JSON_OUTPUT", "log_format", lambda text: "json" if parse_bool(text) else "text")
    take("CORS_ALLOW_ORIGIN", "cors_allow_origin",
         lambda text: [o.strip() for o in text.split(",") if o.strip()])
    hostname = environ.get("HOSTNAME")
    if hostname:
        try:  # a container's HOSTNAME is its own name, not an address to bind: skip it
            values["host"] = ip_address(hostname)
            used.append("HOSTNAME")
        except ValueError:
            pass
    keys = {name: environ[name] for name in ("API_KEY", "VLLM_API_KEY") if environ.get(name)}
    if len(set(keys.values())) > 1:
        errors.append("API_KEY and VLLM_API_KEY are both set, to different keys: keep one, or "
                      "pass --api-key.")
    elif keys:
        values["api_key"] = next(iter(keys.values()))
        used.extend(keys)
    if environ.get("HF_API_TOKEN") and not environ.get("HF_TOKEN"):
        values["hf_token"] = environ["HF_API_TOKEN"]  # TEI's deprecated spelling
        used.append("HF_API_TOKEN")
    for name, flag in ENV_REFUSED.items():
        if environ.get(name):
            errors.append(f"{name} is set in the environment; {flag} is not supported by "
                          f"pooler: {REFUSED[flag]}")
    return {**values, "peer_env_errors": errors, "peer_env_used": used}


# ---- after parsing: what the options become ----------------------------------------------
_POOLER_CONFIG_POOLING = {"MEAN": "mean", "CLS": "cls", "LAST": "last-token"}
_PER_REQUEST = {"normalize": "normalize", "dimensions": "dimensions",
                "use_activation": "use_activation", "activation": "use_activation",
                "softmax": "use_activation"}


def apply(args: argparse.Namespace, environ=os.environ) -> None:
    """Check and fold the peers' options into pooler's, before anything loads. ValueError
    (the CLI's exit 2) for what cannot be honoured. `environ`: the process environment, where
    the Hugging Face cache and token are handed to huggingface_hub as it reads them."""
    errors = list(getattr(args, "peer_env_errors", []))
    if errors:
        raise ValueError(" ".join(errors))
    _models(args)
    _convert(args)
    _pooler_config(args)
    if args.hf_token:
        environ["HF_TOKEN"] = args.hf_token
    if args.huggingface_hub_cache:
        environ["HF_HUB_CACHE"] = args.huggingface_hub_cache
    per_model = [flag for flag, value in (("--pooling", args.pooling),
                                          ("--default-prompt-name", args.default_prompt_name),
                                          ("--cors-allow-origin", args.cors_allow_origin))
                 if value]
    several = args.models_config or (bool(args.model_arg) + len(args.model or [])) > 1
    if per_model and (args.ray or several):
        raise ValueError(f"{', '.join(per_model)} apply to one model served without --ray; "
                         "drop them, or serve one model.")


def report(args: argparse.Namespace) -> None:
    """Once logging is set up: which variables were read, and what has no effect here."""
    if getattr(args, "peer_env_used", None):
        logger.info("from the environment: %s", ", ".join(args.peer_env_used))
    if args.uds_path:
        logger.info("--uds-path / UDS_PATH is TEI's socket between its router and backend; "
                    "pooler is one process and does not use it. Clients connect to --port.")


def _models(args: argparse.Namespace) -> None:
    """--model-id is the model (alone); MODEL_ID only when no model is given otherwise."""
    given = bool(args.model_arg or args.model or args.models_config)
    if args.model_id:
        if given:
            raise ValueError("--model-id names the model: give it once (MODEL, --model or "
                             "--model-id), not several of them.")
        args.model = [args.model_id]
    elif not given and getattr(args, "env_model_id", None):
        args.model = [args.env_model_id]


def _convert(args: argparse.Namespace) -> None:
    if args.convert in ("embed", "classify"):
        if args.task not in (None, args.convert):
            raise ValueError(f"--convert {args.convert} and --task {args.task} disagree: "
                             "give one.")
        args.task = args.convert


def _pooler_config(args: argparse.Namespace) -> None:
    config = dict(args.pooler_config or {})
    if not config:
        return
    pooling = config.pop("pooling_type", None) or config.pop("seq_pooling_type", None)
    if pooling is not None:
        mapped = _POOLER_CONFIG_POOLING.get(str(pooling).upper())
        if mapped is None:
            raise ValueError(f"--pooler-config pooling_type {pooling!r}: pooler serves MEAN, "
                             "CLS and LAST (the model's own); token outputs come from the "
                             "token_embed / token_classify tasks (--task).")
        if args.pooling not in (None, mapped):
            raise ValueError(f"--pooler-config pooling_type {pooling} and --pooling "
                             f"{args.pooling} disagree: give one.")
        args.pooling = mapped
    chunked = config.pop("enable_chunked_processing", None)
    if chunked:
        args.long_input = "chunk"
    for key in list(config):
        if key in _PER_REQUEST:
            raise ValueError(f"--pooler-config {key}: pooler sets it per request (the "
                             f"`{_PER_REQUEST[key]}` field), not per server; drop it from "
                             "--pooler-config.")
    if config:
        raise ValueError(f"--pooler-config {sorted(config)}: not supported by pooler; it "
                         "reads pooling_type and enable_chunked_processing.")


def after_build(app, args: argparse.Namespace) -> None:
    """What needs the loaded model: --pooling checked against it, --default-prompt-name set,
    CORS added. `app`: one model's FastAPI app (apply refused these with several)."""
    if not (args.pooling or args.default_prompt_name or args.cors_allow_origin):
        return
    engine = app.state.pooler.engine
    if args.pooling:
        check_pooling(engine.model_config, args.pooling)
    if args.default_prompt_name:
        set_default_prompt(engine.model_config, args.default_prompt_name)
    if args.cors_allow_origin:
        from starlette.middleware.cors import CORSMiddleware

        origins = ["*"] if "*" in args.cors_allow_origin else list(args.cors_allow_origin)
        # TEI's CORS: GET and POST, the JSON content type; pooler adds Authorization for
        # --api-key.
        app.add_middleware(CORSMiddleware, allow_origins=origins,
                           allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"])


def check_pooling(model_config, pooling: str) -> None:
    """TEI's --pooling chooses the pooling; pooler's comes from the model folder. Accept the
    value that is already the model's; refuse any other, saying which the model uses."""
    if pooling == "splade":
        if model_config.head != "mlm":
            raise ValueError("--pooling splade needs a *ForMaskedLM (SPLADE) model; this one is "
                             f"{model_config.architecture}.")
        return
    if "embed" not in model_config.model_tasks:
        logger.warning("--pooling %s: the model is not an embedding model (%s); like TEI, "
                       "pooler ignores --pooling for it.", pooling, model_config.architecture)
        return
    from pooler.pooling.dispatch import _default_embed_pooling

    st = model_config.st
    declared = st.pooling.mode if st is not None and st.pooling is not None \
        else _default_embed_pooling(model_config)
    wanted = "lasttoken" if pooling == "last-token" else pooling
    if declared != wanted:
        raise ValueError(f"--pooling {pooling}: this model pools with {declared} (its "
                         "1_Pooling/config.json, or its family's default). pooler serves a "
                         "model with its own pooling: drop --pooling, or serve a copy of the "
                         "folder whose 1_Pooling/config.json declares the pooling you want.")


def set_default_prompt(model_config, name: str) -> None:
    """TEI's --default-prompt-name: one of the model's declared prompts, added to every input
    that names none. Refused, as TEI does, when the model declares no such prompt."""
    st = model_config.st
    prompts = st.prompts if st is not None else {}
    if not prompts:
        raise ValueError(f"--default-prompt-name {name}: the model declares no prompts "
                         "(config_sentence_transformers.json `prompts`).")
    if name not in prompts:
        raise ValueError(f"--default-prompt-name {name}: not among the model's prompts "
                         f"{sorted(prompts)}.")
    model_config.st = dataclasses.replace(st, default_prompt_name=name)
