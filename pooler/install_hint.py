"""The install command for an optional extra that works from where the user is.

`pip install 'pooler[batch]'` works only once pooler is on a package index. From a clone it
fails, and a bare `pip` may not be the interpreter pooler runs in. So the hint names this
interpreter and the extra's own requirements, read from pooler's installed metadata
(`Requires-Dist: pyarrow>=14; extra == "batch"`), which works from a clone, a wheel or an index
alike. Running from a source tree that was never installed, it names the editable install.
"""
from __future__ import annotations

import re
import shlex
import sys
from importlib import metadata
from pathlib import Path

_EXTRA = re.compile(r"""^(?P<req>[^;]+);\s*extra\s*==\s*["'](?P<extra>[^"']+)["']\s*$""")


def extra_requirements(extra: str) -> list[str]:
    """The requirement strings of pooler's `extra` (empty when pooler is not installed)."""
    try:
        requires = metadata.requires("pooler") or []
    except metadata.PackageNotFoundError:
        return []
    return [m["req"].strip() for r in requires
            if (m := _EXTRA.match(r)) and m["extra"] == extra]


def install_command(extra: str) -> str:
    """A shell command that installs `extra` into the running interpreter."""
    python = shlex.quote(sys.executable)
    requirements = extra_requirements(extra)
    if requirements:
        return f"{python} -m pip install {' '.join(shlex.quote(r) for r in requirements)}"
    source = Path(__file__).resolve().parent.parent
    return f"{python} -m pip install -e {shlex.quote(f'{source}[{extra}]')}"
