"""`pooler embed --image`, and image architectures pooler does not run failing with one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from pooler.cli.main import main
from tests.models.image_text_folders import save_tiny_clip


def test_embed_images_and_texts_from_the_cli(tmp_path, capsys):
    folder = save_tiny_clip(tmp_path / "clip")
    path = tmp_path / "cat.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), np.uint8)).save(path)
    assert main(["embed", "--model", str(folder), "a photo of a cat", "--image", str(path),
                 "--image", str(path)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [sorted(x) for x in lines] == [["embedding", "index", "text"],
                                          ["embedding", "image", "index"],
                                          ["embedding", "image", "index"]]
    assert lines[1]["image"] == str(path) and lines[1]["embedding"] == lines[2]["embedding"]
    assert len(lines[0]["embedding"]) == 24
    # images alone: no text is read from stdin
    assert main(["embed", "--model", str(folder), "--image", str(path)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    (tmp_path / "notes.txt").write_text("not an image")
    assert main(["embed", "--model", str(folder), "--image", str(tmp_path / "notes.txt")]) == 2
    assert "inputs[0] is not an image" in capsys.readouterr().err


def _folder(tmp_path, architecture, model_type, **extra):
    folder = tmp_path / architecture
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"architectures": [architecture], "model_type": model_type, **extra}))
    return folder


@pytest.mark.parametrize("architecture, model_type", [
    ("ColIdefics3ForRetrieval", "colidefics3"), ("ModernVBertForRetrieval", "modernvbert"),
    ("Idefics3ForConditionalGeneration", "idefics3"),
    ("Qwen2VLForConditionalGeneration", "qwen2_vl"), ("CLIPVisionModel", "clip_vision_model")])
def test_unsupported_image_architectures_fail_with_one_line(tmp_path, architecture, model_type):
    from pooler.config import ModelConfig
    folder = _folder(tmp_path, architecture, model_type, vision_config={})
    with pytest.raises(ValueError) as info:
        ModelConfig(str(folder))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{architecture} is ")
    assert "does not run yet" in message and "CLIPModel, SiglipModel and Siglip2Model" in message
    assert "ColModernVBertForRetrieval" in message  # what runs page retrieval


def test_an_unknown_vision_model_is_named_too(tmp_path):
    from pooler.config import ModelConfig
    folder = _folder(tmp_path, "FancyVisionEmbedder", "fancy", vision_config={"x": 1})
    with pytest.raises(ValueError, match="FancyVisionEmbedder is a model with a vision tower"):
        ModelConfig(str(folder))


def test_cli_prints_one_line_and_no_traceback(tmp_path):
    folder = _folder(tmp_path, "PaliGemmaForConditionalGeneration", "paligemma",
                     vision_config={})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "pooler", "embed", "--model", str(folder), "hi"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "PaliGemmaForConditionalGeneration is PaliGemma" in lines[0], \
        done.stderr


def test_image_text_models_refuse_the_transformers_runner(tmp_path):
    from pooler.config import ModelConfig
    folder = save_tiny_clip(tmp_path / "clip")
    with pytest.raises(ValueError, match="CLIPModel runs on the native runner only"):
        ModelConfig(str(folder), runner="transformers")
    config = ModelConfig(str(folder))
    assert config.runner == "native" and config.model_tasks == frozenset({"embed"})
    assert config.max_model_len == 16 and config.hidden_size == 24  # text positions, projection


def test_precision_options_on_image_text_models(tmp_path):
    from pooler.config import ModelConfig
    from pooler.engine.llm import Engine
    folder = save_tiny_clip(tmp_path / "clip")
    with pytest.raises(ValueError, match="quantization='int8' is not implemented for "
                                         "image-text models"):
        ModelConfig(str(folder), quantization="int8")
    # bfloat16 goes through the load-time check (timed on the text tower), then runs
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 20, 3), np.uint8))
    want = Engine(str(folder), device="cpu").embed(["a cat", image])
    got = Engine(str(folder), device="cpu", dtype="bfloat16").embed(["a cat", image])
    assert all(np.abs(g.embedding - w.embedding).max() < 0.05 for g, w in zip(got, want))


def test_siglip1_sentencepiece_only_folder_says_why(tmp_path):
    from pooler.engine.llm import Engine
    from tests.models.image_text_folders import save_tiny_siglip
    folder = save_tiny_siglip(tmp_path / "siglip")
    (folder / "tokenizer.json").rename(folder / "spiece.model")  # the hub layout's file name
    with pytest.raises(FileNotFoundError, match="only a SentencePiece spiece.model"):
        Engine(str(folder), device="cpu")


def test_rerank_image_documents_with_an_image_text_model(tmp_path, capsys):
    """`pooler rerank --image-documents` on CLIP: cosine of the text query and each image,
    equal to Engine.score."""
    from pathlib import Path

    from pooler.engine.llm import Engine
    folder = save_tiny_clip(tmp_path / "clip")
    paths = []
    for seed in range(2):
        paths.append(str(tmp_path / f"img{seed}.png"))
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (30, 40, 3), np.uint8)) \
            .save(paths[-1])
    want = Engine(str(folder), device="cpu").score("a cat", [Path(p) for p in paths])
    assert main(["rerank", "--model", str(folder), "--device", "cpu", "--query", "a cat",
                 "--image-documents", *paths]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    by_index = {x["index"]: x for x in lines}
    assert sorted(by_index) == [0, 1] and by_index[1]["document"] == paths[1]
    for o in want:
        assert by_index[o.document_index]["score"] == pytest.approx(o.score, abs=1e-5)
