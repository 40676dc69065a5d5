"""Ray and pyarrow are extras: importing pooler and building the whole CLI (every command's
options, `batch` and `serve --ray` included) imports neither."""
from __future__ import annotations

import subprocess
import sys


def test_core_and_cli_do_not_import_ray_or_pyarrow():
    code = ("import sys, pooler, pooler.cli.main as m; m.build_parser(); "
            "print(sorted(n for n in ('ray', 'pyarrow') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
