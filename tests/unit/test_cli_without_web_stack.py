"""The CLI's offline commands (embed, bench, ...) work where FastAPI/uvicorn are missing (a GPU
box with only torch and transformers): only `pooler serve` needs the web stack."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_BLOCK_WEB = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
            raise ImportError(f"{name} blocked for this test")
sys.meta_path.insert(0, _Blocker())
from pooler.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_parser_and_bench_list_without_fastapi():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _BLOCK_WEB, "bench", "--list"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "embed" in proc.stdout and "colbert" in proc.stdout
