"""schemathesis's `st` command, with one interpreter fault worked around and this suite's
hooks (schemathesis_hooks.py) registered.

On CPython 3.11.7 (this project's interpreter) `ast.parse` can raise "SystemError: AST
constructor recursion depth mismatch" when it runs while hypothesis has raised the recursion
limit (gh-106905, fixed in CPython 3.11.8). hypothesis parses source only to *describe* a lambda
in a strategy's repr, so on that error the description falls back to hypothesis's own
"unknown" form; generation and checks are untouched.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis.internal import lambda_sources
from schemathesis.cli import schemathesis

sys.path.insert(0, str(Path(__file__).parent))
import schemathesis_hooks  # noqa: E402,F401 - registers the hooks

_describe = lambda_sources._lambda_description


def _describe_or_unknown(f, *args, **kwargs):
    try:
        return _describe(f, *args, **kwargs)
    except SystemError:
        return "lambda: <unknown>"


lambda_sources._lambda_description = _describe_or_unknown

if __name__ == "__main__":
    sys.argv[0] = "st"
    sys.exit(schemathesis())
