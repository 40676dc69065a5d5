"""`pooler embed` from arguments, files and stdin, to JSONL and .npy."""
import json
import subprocess
import sys

import numpy as np

from pooler.cli.main import main


def test_embed_arguments_to_jsonl(minilm_engine, capsys):
    assert main(["embed", "hello world", "second text"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in lines] == [0, 1] and lines[1]["text"] == "second text"
    expected = minilm_engine.embed(["hello world"])[0].embedding
    assert np.abs(np.array(lines[0]["embedding"]) - expected).max() <= 1e-6


def test_embed_jsonl_file_to_npy(minilm_engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "first"}\n\n{"text": "second"}\n')
    out = tmp_path / "out.npy"
    assert main(["embed", "--input", str(src), "-o", str(out), "--dimensions", "32"]) == 0
    matrix = np.load(out)
    assert matrix.shape == (2, 32)
    expected = minilm_engine.embed(["second"], dimensions=32)[0].embedding
    assert np.abs(matrix[1] - expected).max() <= 1e-6


def test_embed_stdin_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pooler.cli.main", "embed", "-o",
                           str(tmp_path / "o.jsonl")], input="one\ntwo\nthree\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 3


def test_bad_jsonl_is_a_clear_error(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"txt": "no text field"}\n')
    assert main(["embed", "--input", str(src)]) == 2
    assert "line 1: JSON line needs a string 'text' field" in capsys.readouterr().err


def test_empty_input_file_names_the_file(tmp_path, capsys, monkeypatch):
    src = tmp_path / "empty.txt"
    src.write_text("\n  \n")
    for command in ("embed", "classify", "ner", "sparse"):
        assert main([command, "--input", str(src)]) == 2
        err = capsys.readouterr().err
        assert f"--input {src} had no lines of text" in err, (command, err)
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["embed", "--input", "-"]) == 2
    assert "standard input had no lines of text" in capsys.readouterr().err
