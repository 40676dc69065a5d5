"""Model folders in their real formats: sharded safetensors, .bin, legacy names, errors."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.models.tiny import save_tiny_bert

TEXTS = ["loader test", "another one with more words"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_path):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert", minilm_path)


def _embed(folder):
    from pooler import Engine
    return np.stack([o.embedding for o in Engine(str(folder)).embed(TEXTS)])


def _clone_without_weights(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_sharded_safetensors(tiny_bert, tmp_path):
    state = load_file(tiny_bert / "model.safetensors")
    names = sorted(state)
    folder = _clone_without_weights(tiny_bert, tmp_path / "sharded")
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: state[k].contiguous() for k in keys}, folder / shard)
        weight_map.update({k: shard for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert np.abs(_embed(folder) - _embed(tiny_bert)).max() <= 1e-6


def test_pytorch_bin_with_legacy_names_and_prefix(tiny_bert, tmp_path):
    state = load_file(tiny_bert / "model.safetensors")
    legacy = {}
    for name, tensor in state.items():
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta")
        legacy["bert." + name] = tensor
    folder = _clone_without_weights(tiny_bert, tmp_path / "bin")
    torch.save(legacy, folder / "pytorch_model.bin")
    assert np.abs(_embed(folder) - _embed(tiny_bert)).max() <= 1e-6


def test_unknown_architecture_names_supported_ones(tiny_bert, tmp_path):
    from pooler import Engine
    folder = _clone_without_weights(tiny_bert, tmp_path / "unknown")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FancyNewModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'FancyNewModel' is not implemented.*BertModel.*"
                                         r"runner='transformers'"):
        Engine(str(folder), runner="native")  # "auto" would hand it to the fallback


def test_missing_weights_are_an_error(tiny_bert, tmp_path):
    from pooler import Engine
    state = load_file(tiny_bert / "model.safetensors")
    folder = _clone_without_weights(tiny_bert, tmp_path / "partial")
    save_file({k: v for k, v in state.items() if "layer.1." not in k},
              folder / "model.safetensors")
    with pytest.raises(ValueError, match="missing weights"):
        Engine(str(folder))


def test_missing_model_is_a_clear_error():
    from pooler import Engine
    # tests run with HF_HUB_OFFLINE=1: a name not on this machine is not downloaded
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1 forbids downloading"):
        Engine("someone/not-a-model")
    with pytest.raises(FileNotFoundError, match="not a local folder, and not a hub repository"):
        Engine("./no/such/folder")


def test_hub_name_resolves_to_installed_package(minilm_path):
    from pooler.model_folder import resolve_model_path
    assert resolve_model_path("sentence-transformers/all-MiniLM-L6-v2") == minilm_path.resolve()


def test_reload_weights_swaps_in_place(tiny_bert, tmp_path):
    from pooler import Engine
    folder = _clone_without_weights(tiny_bert, tmp_path / "reload")
    state = load_file(tiny_bert / "model.safetensors")
    save_file(state, folder / "model.safetensors")
    engine = Engine(str(folder))
    before = engine.embed(TEXTS)[0].embedding
    save_file({k: v * 1.5 if "encoder.layer.0" in k else v for k, v in state.items()},
              folder / "model.safetensors")
    engine.reload_weights()
    after = engine.embed(TEXTS)[0].embedding
    assert np.abs(after - before).max() > 1e-3
    assert np.abs(after - _embed(folder)[0]).max() <= 1e-6


def test_hf_cache_layout(tiny_bert, tmp_path, monkeypatch):
    from pooler.model_folder import resolve_model_path
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(tiny_bert, target_is_directory=True)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model_path("acme/tiny") == snapshot
    assert np.abs(_embed("acme/tiny") - _embed(tiny_bert)).max() <= 1e-6


def test_bfloat16_option_runs_close_to_fp32(tiny_bert):
    from pooler import Engine
    bf16 = Engine(str(tiny_bert), dtype="bfloat16").embed(TEXTS)
    fp32 = _embed(tiny_bert)
    for out, ref in zip(bf16, fp32):
        assert out.embedding.dtype == np.float32
        assert float(out.embedding @ ref) > 0.99


def _loaded_state(folder) -> dict:
    from pooler import Engine
    model = Engine(str(folder), runner="native").core.model_runner.model
    return {n: t.clone() for n, t in model.state_dict().items()}


def test_one_pass_backbones_stream_the_checkpoint_and_heads_still_load(minilm_path, tmp_path,
                                                                       monkeypatch):
    # a cross-encoder: the classifier (and BERT's pooler dense) are the tensors the backbone
    # leaves, read in a second pass
    import weakref

    from pooler.models.bert import BertModel
    folder = save_tiny_bert(tmp_path / "ce", minilm_path,
                            architecture="BertForSequenceClassification", num_labels=1)
    monkeypatch.setattr(BertModel, "loads_weights_in_one_pass", False)
    listed = _loaded_state(folder)  # the whole checkpoint held in a list
    monkeypatch.setattr(BertModel, "loads_weights_in_one_pass", True)

    load, seen = BertModel.load_weights, {"kinds": [], "alive": []}

    def watched(self, weights):
        seen["kinds"].append(type(weights).__name__)
        refs = []

        def tracked():
            for name, tensor in weights:
                # the consumer still holds the tensor before this one; any earlier is freed
                seen["alive"].append(sum(r() is not None for r in refs[:-1]))
                refs.append(weakref.ref(tensor))
                del tensor
                yield name, refs[-1]()
        return load(self, tracked())
    monkeypatch.setattr(BertModel, "load_weights", watched)
    streamed = _loaded_state(folder)
    assert seen["kinds"] == ["generator"] and len(seen["alive"]) > 10
    assert max(seen["alive"]) == 0, "copied checkpoint tensors should be freed as loading goes"
    assert streamed.keys() == listed.keys() and any("classifier" in n or "score" in n
                                                    for n in streamed)
    for name in listed:
        assert torch.equal(streamed[name], listed[name]), name


def test_safetensors_reads_match_the_library_for_every_dtype(tmp_path):
    from pooler.checkpoint import iterate_weights
    g = torch.Generator().manual_seed(0)
    state = {"a.f32": torch.randn(3, 5, generator=g), "b.f16": torch.randn(7, generator=g).half(),
             "c.bf16": torch.randn(2, 2, generator=g).bfloat16(),
             "d.i64": torch.arange(6).reshape(2, 3), "e.bool": torch.tensor([True, False, True]),
             "f.scalar": torch.tensor(2.5), "g.empty": torch.zeros(0, 4),
             "h.LayerNorm.gamma": torch.ones(4)}
    folder = tmp_path / "m"
    folder.mkdir()
    save_file(state, folder / "model.safetensors")
    read = dict(iterate_weights(folder))
    stored = load_file(folder / "model.safetensors")
    expected = {n.replace(".gamma", ".weight"): t for n, t in stored.items()}
    assert read.keys() == expected.keys()
    for name, tensor in expected.items():
        assert read[name].dtype == tensor.dtype and torch.equal(read[name], tensor), name
    selected = iterate_weights(folder, select=lambda n: n.startswith("d."))
    assert [n for n, _ in selected] == ["d.i64"]


def test_a_truncated_safetensors_file_is_a_clear_error(tmp_path):
    from pooler.checkpoint import iterate_weights
    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"w": torch.randn(64, 64)}, folder / "model.safetensors")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated"):
        list(iterate_weights(folder))


def test_safetensors_mapping_is_reopened_after_its_byte_window(tmp_path, monkeypatch):
    """The pages a safe_open mapping has read stay in RSS until it closes, so the reader
    reopens the file after MAPPED_BYTES_PER_OPEN bytes; the tensors are the same either way."""
    from pooler import checkpoint
    g = torch.Generator().manual_seed(1)
    state = {f"w{i}": torch.randn(16, 16, generator=g) for i in range(5)}  # 1 KiB each
    folder = tmp_path / "m"
    folder.mkdir()
    save_file(state, folder / "model.safetensors")
    opens = []
    real_open = checkpoint.safe_open
    monkeypatch.setattr(checkpoint, "safe_open",
                        lambda *a, **kw: opens.append(a[0]) or real_open(*a, **kw))
    monkeypatch.setattr(checkpoint, "MAPPED_BYTES_PER_OPEN", 2 * 1024)
    read = dict(checkpoint.iterate_weights(folder))
    assert read.keys() == state.keys()
    assert all(torch.equal(read[n], t) for n, t in state.items())
    assert len(opens) == 1 + 3  # the names, then windows of 2, 2 and 1 tensors
