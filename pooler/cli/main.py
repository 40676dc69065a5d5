"""`pooler` command line: one subcommand per module in pooler/cli."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module defines `add_parser(subparsers)` which registers its command and a `run(args)`.
_COMMAND_MODULES = ["embed"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pooler", description="Serve and run pooling models: embeddings, rerankers, "
        "ColBERT, token classifiers and SPLADE.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(f"pooler.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"pooler {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
