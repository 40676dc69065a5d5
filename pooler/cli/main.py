"""`pooler` command line: one subcommand per module in pooler/cli."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

# Before any subcommand imports torch: OpenMP reads its spin setting once, when torch loads it
# (pooler/__init__.py does the same; this keeps the CLI right if that ever changes).
from pooler.cpu_threads import prefer_short_openmp_spin

prefer_short_openmp_spin()

import pooler.cli as cli_package  # noqa: E402


def _command_modules():
    """Every module in pooler/cli that defines `add_parser(subparsers)` is a subcommand."""
    for info in sorted(pkgutil.iter_modules(cli_package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"pooler.cli.{info.name}")
        if hasattr(module, "add_parser"):
            yield module


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pooler")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pooler", description="Serve and run pooling models: embeddings, rerankers, "
        "ColBERT, token classifiers and SPLADE.")
    parser.add_argument("--version", action="version", version=f"pooler {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _command_modules():
        module.add_parser(sub)
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
