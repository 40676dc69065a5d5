"""Hub loading by name against a fake hub (tests/fake_hub.py) on 127.0.0.1: the real
huggingface_hub client and pooler's resolution code, only the server is fake."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fake_hub import FakeHub, serve_fake_hub
from tests.models.tiny import add_st_pooling, save_tiny_bert

TEXTS = ["hub loading by name", "a second, longer sentence to embed"]
REPO = "acme/tiny-embedder"
GATED = "acme/gated-embedder"
TOKEN = "hf_fake_token_123"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, minilm_path):
    # hidden 96: a 12 MB checkpoint, more than huggingface_hub's 10 MB download chunk, so an
    # interrupted download has written a whole chunk to resume from.
    folder = save_tiny_bert(tmp_path_factory.mktemp("hub") / "tiny", minilm_path,
                            hidden_size=96, intermediate_size=128)
    add_st_pooling(folder, "mean", normalize=True)
    # Files a repository often carries that pooler must not download.
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"onnx" * 100)
    (folder / "onnx" / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"a duplicate of the safetensors")
    (folder / "README.md").write_text("# tiny")
    return folder


@pytest.fixture
def hub(model_folder):
    fake = FakeHub()
    fake.add_folder(REPO, model_folder, tags=("v1.0",))
    fake.add_folder(GATED, model_folder, token=TOKEN)
    with serve_fake_hub(fake) as url:
        fake.url = url
        yield fake


@pytest.fixture
def online(hub, tmp_path, monkeypatch):
    """The environment a user sets: HF_ENDPOINT at the fake, a fresh cache, online."""
    return _go_online(hub.url, tmp_path, monkeypatch)


def _go_online(url, tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "no-token"))
    # tests/conftest.py sets HF_HUB_OFFLINE=1 before huggingface_hub is imported, which reads
    # it once at import; a user's process starts online.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return cache


def _embed(model, **kwargs):
    from pooler import Engine
    return np.stack([o.embedding for o in Engine(str(model), **kwargs).embed(TEXTS)])


def test_download_by_name_fetches_only_needed_files(hub, online, model_folder):
    from pooler.model_folder import resolve_model_path

    path = resolve_model_path(REPO)
    assert path.parent.parent == online / "models--acme--tiny-embedder"
    got = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert got == ["1_Pooling/config.json", "config.json", "model.safetensors", "modules.json",
                   "sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json",
                   "tokenizer_config.json", "vocab.txt"]
    fetched = {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
    assert "model.onnx" not in fetched and "pytorch_model.bin" not in fetched
    np.testing.assert_allclose(_embed(REPO), _embed(model_folder), atol=1e-6)


def test_bin_weights_only_without_safetensors():
    from pooler.hub import select_model_files

    files = ["config.json", "pytorch_model.bin", "training_args.bin", "onnx/model.onnx",
             "2_Dense/config.json", "2_Dense/pytorch_model.bin", "1_Pooling/config.json",
             "colbert_linear.pt", "sparse_linear.pt", "optimizer.pt", "flax_model.msgpack",
             "sentencepiece.bpe.model", "imgs/a.jpg"]
    assert select_model_files(files) == [
        "config.json", "pytorch_model.bin", "2_Dense/config.json", "2_Dense/pytorch_model.bin",
        "1_Pooling/config.json", "colbert_linear.pt", "sparse_linear.pt",
        "sentencepiece.bpe.model"]
    assert "pytorch_model.bin" not in select_model_files(files + ["model.safetensors"])
    assert "2_Dense/pytorch_model.bin" in select_model_files(files + ["model.safetensors"])


def test_revision_tag_and_missing_revision(hub, online):
    from pooler.model_folder import resolve_model_path

    path = resolve_model_path(REPO, revision="v1.0")
    assert (online / "models--acme--tiny-embedder" / "refs" / "v1.0").read_text() == path.name
    assert any("/revision/v1.0" in p for _, p, _ in hub.requests)
    with pytest.raises(FileNotFoundError, match="Revision 'v9' of acme/tiny-embedder does not exist"):
        resolve_model_path(REPO, revision="v9")


def test_unknown_repo_is_a_clear_error(hub, online):
    from pooler import Engine

    with pytest.raises(FileNotFoundError, match="neither a local folder nor a repository"):
        Engine("acme/no-such-model")


def test_gated_repo_needs_token(hub, online, monkeypatch, model_folder):
    from pooler.model_folder import resolve_model_path

    with pytest.raises(FileNotFoundError, match="is gated.*set HF_TOKEN"):
        resolve_model_path(GATED)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = resolve_model_path(GATED)
    assert (path / "model.safetensors").read_bytes() == (model_folder / "model.safetensors").read_bytes()


def test_interrupted_download_resumes_with_range(hub, online, model_folder):
    from pooler.model_folder import resolve_model_path

    data = (model_folder / "model.safetensors").read_bytes()
    hub.interrupt_once.add("model.safetensors")
    path = resolve_model_path(REPO)
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).digest() == \
        hashlib.sha256(data).digest()
    # The first GET broke 1 KB before the end; the client kept the 10 MB chunk it had written
    # (huggingface_hub writes in DOWNLOAD_CHUNK_SIZE pieces) and asked only for the rest.
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE

    kept = (len(data) - 1024) // DOWNLOAD_CHUNK_SIZE * DOWNLOAD_CHUNK_SIZE
    assert kept > 0
    assert hub.gets("model.safetensors") == [None, f"bytes={kept}-"]


def test_unreachable_hub_says_what_to_do_next(tmp_path, monkeypatch):
    """No network (here: a closed port on 127.0.0.1) ends with the next steps, not just the
    socket error."""
    import socket

    from pooler.model_folder import resolve_model_path

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    cache = _go_online(f"http://127.0.0.1:{port}", tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError) as info:
        resolve_model_path("BAAI/bge-small-en-v1.5")
    message = str(info.value)
    assert f"http://127.0.0.1:{port} could not be reached" in message
    for step in ("local model folder", "HF_ENDPOINT", "HF_HUB_OFFLINE=1", str(cache)):
        assert step in message, step


def test_offline_mode_uses_warm_cache_and_never_connects(hub, online, monkeypatch, model_folder):
    from pooler.model_folder import resolve_model_path

    online_path = resolve_model_path(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    assert resolve_model_path(REPO) == online_path
    np.testing.assert_allclose(_embed(REPO), _embed(model_folder), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1 forbids downloading"):
        resolve_model_path("acme/never-downloaded")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1 forbids downloading"):
        resolve_model_path(REPO, revision="v1.0")  # never fetched at that tag
    assert hub.requests == []


def test_remote_code_model_is_refused_before_weights(hub, online, tmp_path, model_folder):
    from pooler import Engine

    # jina-embeddings-v2's JinaBert: neither transformers nor pooler defines it (NomicBert,
    # GTE's NewModel and Jina v3 are native now, remote-code layout included).
    folder = tmp_path / "jinabert"
    folder.mkdir()
    for f in model_folder.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["JinaBertForMaskedLM"], model_type="bert",
                  auto_map={"AutoConfig": "jinaai/jina-bert-implementation--configuration_bert"
                                          ".JinaBertConfig",
                            "AutoModel": "jinaai/jina-bert-implementation--modeling_bert"
                                         ".JinaBertModel"})
    (folder / "config.json").write_text(json.dumps(config))
    hub.add_folder("acme/remote-code", folder)
    with pytest.raises(ValueError, match="architecture 'JinaBertForMaskedLM'.*never runs remote code"
                       ".*Natively supported architectures: .*BertModel"):
        Engine("acme/remote-code")
    assert hub.gets("model.safetensors") == []
    with pytest.raises(ValueError, match="never runs remote code"):
        Engine(str(folder))  # a local folder is refused the same way


def test_cli_embeds_by_hub_name(hub, online, model_folder):
    """What a user types, in a fresh process: `pooler embed --model ORG/NAME --revision`."""
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(online)}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pooler.cli.main", "embed", "--model", REPO, "--revision", "v1.0",
         *TEXTS], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    vectors = np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()])
    np.testing.assert_allclose(vectors, _embed(model_folder), atol=1e-6)


def test_partial_cached_snapshot_is_completed_not_used(hub, online, model_folder):
    """A snapshot missing a file pooler needs (an earlier download that stopped) is not
    taken from the cache: the download completes it."""
    from pooler.model_folder import find_in_hf_cache, resolve_model_path

    path = resolve_model_path(REPO)
    (path / "1_Pooling" / "config.json").unlink()
    assert find_in_hf_cache(REPO) is None
    hub.requests.clear()
    assert resolve_model_path(REPO) == path
    assert (path / "1_Pooling" / "config.json").is_file()
    assert hub.gets("model.safetensors") == []  # what was there is not fetched again


def test_gliner_by_hub_name(online, monkeypatch, tmp_path):
    """A GLiNER repo (gliner_config.json, no config.json) downloads and serves by name."""
    pytest.importorskip("gliner")
    from pooler import Engine
    from tests.models.gliner_folders import LABELS, TEXTS as GLINER_TEXTS, build_gliner

    folder = build_gliner(tmp_path / "gliner")
    fake = FakeHub()
    fake.add_folder("acme/tiny-gliner", folder)
    with serve_fake_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        by_name = Engine("acme/tiny-gliner")
        got = by_name.ner(GLINER_TEXTS, labels=LABELS, threshold=0.2)
        by_name.shutdown()
    local = Engine(str(folder))
    want = local.ner(GLINER_TEXTS, labels=LABELS, threshold=0.2)
    local.shutdown()
    assert sum(len(e) for e in want) > 0 and got == want
    assert any(p.endswith("gliner_config.json") for m, p, _ in fake.requests if m == "GET")
