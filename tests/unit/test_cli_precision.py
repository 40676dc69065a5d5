"""`pooler embed --precision/--calibration`, `-o out.csv`, `pooler --version`, `python -m pooler`."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from pooler.cli.main import main
from pooler.quantize_output import quantize_embeddings

TEXTS = ["hello world", "second text", "a third one"]


def test_precision_to_npy_and_jsonl(minilm_engine, tmp_path, capsys):
    floats = np.stack([o.embedding for o in minilm_engine.embed(TEXTS)])
    out = tmp_path / "bits.npy"
    assert main(["embed", *TEXTS, "--precision", "ubinary", "-o", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), quantize_embeddings(floats, "ubinary"))
    calibration = tmp_path / "cal.npy"
    np.save(calibration, np.vstack([floats, -floats]))
    assert main(["embed", *TEXTS, "--precision", "int8", "--calibration",
                 str(calibration)]) == 0
    rows = [json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()]
    want = quantize_embeddings(floats, "int8", calibration_embeddings=np.load(calibration))
    assert np.abs(np.array(rows) - want.astype(int)).max() <= 1


def test_csv_output_and_refused_extensions(minilm_engine, tmp_path, capsys):
    out = tmp_path / "out.csv"
    assert main(["embed", *TEXTS[:2], "-o", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0][:3] == ["index", "text", "e0"] and len(rows[0]) == 2 + 384
    assert rows[2][1] == "second text"
    np.testing.assert_allclose([float(x) for x in rows[1][2:]],
                               minilm_engine.embed("hello world")[0].embedding, atol=1e-6)
    assert main(["embed", "x", "-o", str(tmp_path / "out.txt")]) == 2
    assert "pick one of those extensions" in capsys.readouterr().err


def test_calibration_needs_int8(tmp_path, capsys):
    np.save(tmp_path / "c.npy", np.zeros((2, 384)))
    assert main(["embed", "x", "--precision", "binary", "--calibration",
                 str(tmp_path / "c.npy")]) == 2
    assert "--calibration is for --precision int8 or uint8" in capsys.readouterr().err


def test_version_and_python_dash_m(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("pooler ")
    proc = subprocess.run([sys.executable, "-m", "pooler", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "embed" in proc.stdout
