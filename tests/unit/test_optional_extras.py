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


def test_install_hint_names_this_interpreter_and_the_extras_requirements():
    """A clone has no 'pooler[batch]' on an index: the hint installs the extra's own
    requirements into the interpreter pooler runs in."""
    from pooler.install_hint import extra_requirements, install_command

    assert any(r.startswith("pyarrow") for r in extra_requirements("batch"))
    assert any(r.startswith("ray[") for r in extra_requirements("ray"))
    command = install_command("batch")
    assert command.startswith(f"{sys.executable} -m pip install") and "pyarrow" in command
    assert "pooler[" not in command


def test_batch_without_pyarrow_gives_the_command_that_works(tmp_path, monkeypatch, capsys):
    from pooler.cli.main import main

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    corpus = tmp_path / "in.jsonl"
    corpus.write_text('{"text": "a"}\n')
    assert main(["batch", "--input", str(corpus), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "needs pyarrow" in err and f"{sys.executable} -m pip install" in err
