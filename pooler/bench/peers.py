"""The libraries `pooler bench` runs beside pooler (its peers, and what builds some inputs),
and what a missing one means: its sides are skipped, named with the one install command that
brings them all (`pip install 'pooler[bench]'`, spelled for this interpreter)."""
from __future__ import annotations

import importlib.util
import re

# Module -> the package that provides it (the [bench] extra in pyproject.toml pins each).
PEER_PACKAGES = {"sentence_transformers": "sentence-transformers",
                 "transformers": "transformers", "onnxruntime": "onnxruntime",
                 "onnx": "onnx", "onnxscript": "onnxscript", "fastembed": "fastembed",
                 "peft": "peft", "matplotlib": "matplotlib"}
_NO_MODULE = re.compile(r"No module named '([A-Za-z0-9_]+)")


def bench_install_command() -> str:
    from pooler.install_hint import install_command
    return install_command("bench")


def installed(module: str) -> bool:
    """Whether this interpreter can import `module` (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_peers() -> list[str]:
    """The peer packages this interpreter cannot import."""
    return [package for module, package in PEER_PACKAGES.items()
            if module != "matplotlib" and not installed(module)]


class MissingPeer(RuntimeError):
    """A side stopped because a library it needs is not installed."""

    def __init__(self, module: str):
        self.package = PEER_PACKAGES.get(module, module)
        super().__init__(f"needs {self.package}, which is not installed "
                         f"({bench_install_command()} brings every peer)")


def missing_module(output: str) -> str | None:
    """The top-level module a side's error output says it could not import, if any."""
    found = _NO_MODULE.findall(output)
    return found[-1].split(".")[0] if found else None


def check_chart_support() -> None:
    """--chart draws with matplotlib: refuse before any work when it is missing."""
    if not installed("matplotlib"):
        raise ValueError("--chart draws the chart with matplotlib, which is not installed: "
                         f"{bench_install_command()} (or drop --chart).")
