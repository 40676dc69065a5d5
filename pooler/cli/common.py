"""Shared CLI pieces: engine options and reading inputs from arguments, files or stdin."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable

from pooler.model_folder import DEFAULT_MODEL


def add_engine_args(parser: argparse.ArgumentParser, task: bool = True,
                    several_models: bool = False) -> None:
    """task=False: the command defines its own --task (pooler batch). several_models: --model
    may repeat (pooler serve), giving a list (None when not given)."""
    if several_models:
        parser.add_argument("--model", action="append", default=None,
                            help="model folder, installed model package name, or Hugging Face "
                                 "hub id ORG/NAME; repeat it to serve several models from one "
                                 f"server (default: {DEFAULT_MODEL})")
    else:
        parser.add_argument("--model", default=DEFAULT_MODEL,
                            help="model folder, installed model package name, or Hugging Face "
                                 "hub id ORG/NAME (cached, else downloaded) "
                                 f"(default: {DEFAULT_MODEL})")
    parser.add_argument("--revision", default=None,
                        help="hub branch, tag or commit hash of a hub model (default: main)")
    if task:
        parser.add_argument("--task", default=None, help="embed | classify | token_embed | "
                            "token_classify (default: model's)")
    parser.add_argument("--runner", default="auto", type=_runner,
                        choices=["auto", "native", "transformers"],
                        help="native engine, or the transformers fallback (vLLM's "
                             "--runner pooling is auto)")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    parser.add_argument("--device", default="auto", help="cpu | cuda | auto")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="token budget of one forward pass (default: 2048 on CPU, "
                        "16384 on CUDA)")
    parser.add_argument("--max-num-seqs", type=int, default=256,
                        help="most sequences in one forward pass")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--hf-overrides", default=None, type=_json_object,
                        help="JSON object merged into config.json, e.g. a Qwen3-Reranker as a "
                             "classifier: '{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                             "\"classifier_from_token\": [\"no\", \"yes\"], "
                             "\"is_original_qwen3_reranker\": true}'")
    parser.add_argument("--quantization", default=None, choices=["int8"],
                        help="int8: dynamic int8 linear layers on CPU (opt-in; "
                             "see docs/models/precision.md for speed and accuracy)")
    parser.add_argument("--precision-check", default="fallback",
                        choices=["fallback", "refuse", "off"],
                        help="when --dtype bfloat16 or --quantization int8 is not faster than "
                             "fp32 on this CPU (timed at load): fallback runs fp32 with one log "
                             "line, refuse stops with an error, off runs it anyway "
                             "(default: fallback)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """Engine(**kwargs) from the engine options (plain values: Ray ships them to actors).
    A command with its own --task sets `engine_task` (None: the model's task)."""
    task = args.engine_task if hasattr(args, "engine_task") else args.task
    kwargs = dict(model=args.model, task=task, runner=args.runner, dtype=args.dtype,
                  device=args.device, max_num_batched_tokens=args.max_num_batched_tokens,
                  max_num_seqs=args.max_num_seqs, num_threads=args.threads,
                  quantization=getattr(args, "quantization", None),
                  precision_check=getattr(args, "precision_check", "fallback"),
                  revision=getattr(args, "revision", None),
                  hf_overrides=getattr(args, "hf_overrides", None))
    if getattr(args, "max_model_len", None) is not None:  # pooler serve's (vLLM's) option
        kwargs["max_model_len"] = args.max_model_len
    lora_modules = getattr(args, "lora_modules", None)
    if lora_modules or getattr(args, "enable_lora", False):  # pooler serve's LoRA options
        names = [name for name, _ in lora_modules or []]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"--lora-modules names {duplicates} more than once.")
        kwargs.update(lora_modules=dict(lora_modules or []), enable_lora=True,
                      max_loras=args.max_loras, max_lora_rank=args.max_lora_rank)
    return kwargs


def engine_from_args(args: argparse.Namespace):
    from pooler.engine.llm import Engine

    kwargs = engine_kwargs(args)
    return Engine(kwargs.pop("model"), **kwargs)


def _runner(text: str) -> str:
    """vLLM spells pooler's `auto` `pooling` (pooler runs nothing else)."""
    if text == "pooling":
        return "auto"
    if text in ("generate", "draft"):
        raise argparse.ArgumentTypeError(
            f"{text} is vLLM's text-generation runner; pooler serves pooling models only "
            "(--runner pooling, or leave it out)")
    return text


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object ({...})")
    return value


def add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="*", help="texts; none means read --input or stdin")
    parser.add_argument("--input", "-i", default=None,
                        help="file with one text per line, or JSONL with a 'text' field "
                             "('-' for stdin)")


def add_truncation_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-truncate", action="store_true",
                        help="fail on over-long inputs instead of truncating them")


def split_labels(values: list[str] | None) -> list[str] | None:
    """--labels values (each comma-separated, the option repeatable) as one list of labels."""
    if values is None:
        return None
    return [label.strip() for value in values for label in value.split(",") if label.strip()]


def read_texts(args: argparse.Namespace) -> list[str]:
    if args.texts:
        return list(args.texts)
    if args.input in (None, "-"):
        if args.input is None and sys.stdin.isatty():
            raise ValueError("no input: pass texts as arguments, --input FILE, or pipe stdin.")
        texts, source = list(parse_lines(sys.stdin)), "standard input"
    else:
        with open(args.input, encoding="utf-8") as f:
            texts, source = list(parse_lines(f)), f"--input {args.input}"
    if not texts:
        raise ValueError(f"{source} had no lines of text (blank lines are skipped): give one "
                         "text per line, or pass the texts as arguments.")
    return texts


def parse_lines(lines: Iterable[str]) -> Iterable[str]:
    """One text per line; a line that is a JSON object takes its 'text' field."""
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {number}: invalid JSON ({exc}).") from exc
            if "text" not in record or not isinstance(record["text"], str):
                raise ValueError(f"line {number}: JSON line needs a string 'text' field.")
            yield record["text"]
        else:
            yield line
