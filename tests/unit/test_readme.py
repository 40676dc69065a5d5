"""The README stays short and every command in it works as written: each `make` target exists,
each `pooler ...` line parses with the real CLI parser, each Python block compiles and calls
methods `Engine` has, and each relative link points at a file in the repository. The docs site
itself is checked by `make docs` (mkdocs build --strict)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pooler.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Pages whose commands a newcomer copies first; the same checks as the README.
FIRST_PAGES = [README, ROOT / "docs" / "getting-started.md"]
# The variable names the README's Python examples give their engines.
ENGINE_NAMES = ("engine", "ce", "ner", "gliner", "colbert", "splade", "m3")


def _blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M)


def _shell_commands(path: Path) -> list[list[str]]:
    """Each command line of the page's bash blocks as argv, continuations joined, comments and
    anything after a pipe dropped."""
    commands = []
    for block in _blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if "|" in argv:
                argv = argv[:argv.index("|")]
            if argv:
                commands.append(argv)
    return commands


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_states_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    targets = _makefile_targets()
    assert {"demo", "test"} <= targets


@pytest.mark.parametrize("page", FIRST_PAGES, ids=lambda p: p.name)
def test_make_targets_exist(page):
    targets = _makefile_targets()
    used = {argv[1] for argv in _shell_commands(page) if argv[0] == "make" and len(argv) > 1}
    assert used, f"{page.name} shows no make command"
    assert used <= targets, f"{page.name} names make targets the Makefile lacks: {used - targets}"


@pytest.mark.parametrize("page", FIRST_PAGES, ids=lambda p: p.name)
def test_pooler_commands_parse(page):
    commands = [argv for argv in _shell_commands(page) if argv[0] == "pooler"]
    assert len(commands) >= 3, f"{page.name}: expected pooler examples, found {commands}"
    parser = build_parser()
    for argv in commands:
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit as exc:  # argparse's way of refusing an argument
            pytest.fail(f"{page.name}: `{shlex.join(argv)}` does not parse (exit {exc.code})")
        assert args.command == argv[1]


@pytest.mark.parametrize("page", FIRST_PAGES, ids=lambda p: p.name)
def test_python_examples_compile_and_call_engine_methods(page):
    from pooler import Engine

    blocks = _blocks(page, "python")
    assert blocks, f"{page.name} has no Python example"
    for block in blocks:
        compile(block, f"<{page.name}>", "exec")
        for name, method in re.findall(rf"\b({'|'.join(ENGINE_NAMES)})\.(\w+)\(", block):
            assert callable(getattr(Engine, method, None)), (
                f"{page.name}: `{name}.{method}(...)` but Engine has no method {method!r}")


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert relative, "the README links into docs/"
    for link in relative:
        path = link.split("#", 1)[0]
        if path:
            assert (ROOT / path).exists(), f"README links to {link}, which does not exist"


def test_benchmarks_readme_lists_every_script():
    folder = ROOT / "benchmarks"
    listed = set(re.findall(r"^\| `([\w.]+)` \|", (folder / "README.md").read_text(), re.M))
    present = {p.name for p in folder.iterdir() if p.suffix in (".py", ".c")}
    assert listed == present, (f"benchmarks/README.md lists {sorted(listed - present)} that are "
                               f"gone and misses {sorted(present - listed)}")
