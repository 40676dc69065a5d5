"""Read a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors/.bin) onto a loaded
pooler model: every update checked against the layer it lands on, so an adapter made for
another base, or with ranks its config does not declare, is refused here and never reaches a
step.

Names: PEFT saves each targeted layer under its name in the transformers model
(`base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight`). The backbone's
own rename table (`weight_renames`, the one its checkpoint loading uses) maps that layer to
pooler's (`layers.0.qkv_proj`, slot 0 of the fused q/k/v projection); families whose names
equal the checkpoint's (ModernBERT) need none. Head layers keep the checkpoint's names inside
pooler's poolers (pooling/classify.py), so they are found by name suffix. q, k and v updates of
one fused projection become one update: x @ [A_q; A_k; A_v]^T gives the three low-rank
activations at once, and each projection's B lands only on its own third of the output.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pooler.checkpoint import strip_prefix
from pooler.layers.lora import AdapterWeights, LowRank, Replacement

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_PEFT_PREFIX = "base_model.model."
_LORA_SUFFIX = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")
# PEFT options that change the math beyond W + scaling * B @ A: refused, with the option named.
# Layers of the transformers model that pooler's tasks for this folder never run (BertModel's
# pooler on an embedding model): an update there changes no output pooler gives, so it is
# skipped rather than refused.
_UNUSED_LAYERS = ("pooler.dense",)
_UNSUPPORTED_OPTIONS = ("use_dora", "lora_bias", "fan_in_fan_out", "layer_replication",
                        "trainable_token_indices", "target_parameters",
                        "alora_invocation_tokens", "use_qalora", "use_bdlora")


class AdapterError(ValueError):
    """An adapter folder that cannot be served on this model; the message names the cause."""


@dataclass
class _Update:
    a: torch.Tensor  # [rank, in]
    b: torch.Tensor  # [out, rank]
    scaling: float


def read_adapter(name: str, path: str | Path, model: nn.Module, base_name: str,
                 max_rank: int) -> AdapterWeights:
    """The adapter at `path` as updates of `model`'s layers (a PoolingModel: backbone +
    pooler), on the model's device and dtype. AdapterError names what does not fit."""
    folder = Path(path)
    config = _read_config(name, folder)
    tensors = _read_tensors(name, folder)
    param = next(model.parameters())
    lora: dict[str, dict[str, torch.Tensor]] = {}
    whole: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        key = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
        key = key.replace(".modules_to_save.default.", ".").replace(".modules_to_save.", ".")
        match = _LORA_SUFFIX.match(key)
        if match:
            lora.setdefault(match["module"], {})[match["part"]] = tensor
        elif "lora_" in key:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} is a LoRA part pooler does "
                               "not apply (only lora_A/lora_B of linear layers are served).")
        else:
            whole[key] = tensor
    if not lora and not whole:
        raise AdapterError(f"adapter {name!r}: {folder} holds no LoRA weights.")
    where = f"adapter {name!r} (trained on base " \
            f"{config.get('base_model_name_or_path') or 'unnamed'!r}, served on {base_name!r})"
    weights = AdapterWeights(name)
    fused: dict[str, dict[int, _Update]] = {}
    for module_name, parts in sorted(lora.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterError(f"{where}: layer {module_name!r} has lora_{''.join(parts)} "
                               "but not both lora_A and lora_B.")
        update = _update(where, config, module_name, parts["A"], parts["B"], max_rank)
        found = _find_layer(where, model, module_name)
        if found is None:
            continue
        target, slot = found
        layer = model.get_submodule(target)
        in_features, out_features = _linear_shape(where, target, layer)
        if slot is not None:
            out_features //= 3
        if update.a.shape[1] != in_features or update.b.shape[0] != out_features:
            raise AdapterError(
                f"{where}: layer {module_name!r} takes {update.a.shape[1]} inputs and gives "
                f"{update.b.shape[0]} outputs in the adapter, but {in_features} and "
                f"{out_features} in this model: the adapter was made for another base model.")
        if slot is None:
            weights.low_rank[target] = _low_rank([(update, 0)], param)
        else:
            fused.setdefault(target, {})[slot] = update
    for target, slots in fused.items():
        out_features = _linear_shape(where, target, model.get_submodule(target))[1] // 3
        weights.low_rank[target] = _low_rank(
            [(u, s * out_features) for s, u in sorted(slots.items())], param)
    for key, tensor in whole.items():
        _add_replacement(where, model, weights, key, tensor, param)
    return weights


def _read_config(name: str, folder: Path) -> dict:
    if not folder.is_dir():
        raise AdapterError(f"adapter {name!r}: {folder} is not a folder; pass the folder "
                           f"PEFT's save_pretrained wrote ({CONFIG_FILE} + adapter_model.*).")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise AdapterError(f"adapter {name!r}: {folder} has no {CONFIG_FILE}; it is not a "
                           "PEFT adapter folder.") from None
    except json.JSONDecodeError as exc:
        raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is not valid JSON ({exc}).") \
            from None
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type is {config.get('peft_type')!r}; "
                           "pooler serves LoRA adapters (peft_type 'LORA') only.")
    for option in _UNSUPPORTED_OPTIONS:
        if config.get(option):
            raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} sets {option}="
                               f"{config[option]!r}, which pooler does not apply; merge this "
                               "adapter into the base (merge_and_unload) and serve that model.")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} sets bias={config['bias']!r}; "
                           "pooler applies adapters trained with bias='none' only.")
    return config


def _read_tensors(name: str, folder: Path) -> dict[str, torch.Tensor]:
    for file_name in WEIGHT_FILES:
        file = folder / file_name
        if not file.is_file():
            continue
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(file))
        return torch.load(file, map_location="cpu", weights_only=True)
    raise AdapterError(f"adapter {name!r}: {folder} has neither of {list(WEIGHT_FILES)}.")


def _pattern_value(patterns: dict, module_name: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: a key matches a module name ending in it."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default


def _update(where: str, config: dict, module_name: str, a: torch.Tensor, b: torch.Tensor,
            max_rank: int) -> _Update:
    rank = int(_pattern_value(config.get("rank_pattern"), module_name, config.get("r", 8)))
    alpha = float(_pattern_value(config.get("alpha_pattern"), module_name,
                                 config.get("lora_alpha", 8)))
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
        raise AdapterError(
            f"{where}: layer {module_name!r} has lora_A {tuple(a.shape)} and lora_B "
            f"{tuple(b.shape)}, but {CONFIG_FILE} declares rank {rank} for it (r / "
            "rank_pattern): the weights and the config do not belong together.")
    if rank > max_rank:
        raise AdapterError(f"{where}: layer {module_name!r} has rank {rank}, above "
                           f"max_lora_rank={max_rank}; raise --max-lora-rank to serve it.")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return _Update(a.float(), b.float(), scaling)


def _find_layer(where: str, model: nn.Module, module_name: str) -> tuple[str, int | None] | None:
    """pooler's layer for a transformers layer name: (qualified name, slot of a fused q/k/v
    projection or None); None for a layer no served task runs."""
    backbone = model.backbone
    name = strip_prefix(module_name, tuple(getattr(backbone, "weight_prefixes", ())))
    renames = getattr(backbone, "weight_renames", None)
    if renames is not None:
        for pattern, repl, slot in renames:
            if pattern.match(name + ".weight"):
                target = pattern.sub(repl, name + ".weight").rsplit(".", 1)[0]
                return f"backbone.{target}", slot
    elif _is_module(backbone, name):
        return f"backbone.{name}", None
    heads = _head_layers(model, name)
    if len(heads) == 1:
        return heads[0], None
    if not heads and name in _UNUSED_LAYERS:
        return None
    raise AdapterError(f"{where}: it targets layer {module_name!r}, which this model does not "
                       "have (or has several of): the adapter was made for another base or "
                       "architecture.")


def _head_layers(model: nn.Module, name: str) -> list[str]:
    return [f"pooler.{n}" for n, _ in model.pooler.named_modules()
            if n == name or n.endswith("." + name)]


def _is_module(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
    except AttributeError:
        return False
    return bool(name)


def _linear_shape(where: str, target: str, layer: nn.Module) -> tuple[int, int]:
    if not isinstance(getattr(layer, "in_features", None), int):
        raise AdapterError(f"{where}: pooler's layer {target!r} is not a linear layer; LoRA "
                           "updates apply to linear layers only.")
    return layer.in_features, layer.out_features


def _low_rank(updates: list[tuple[_Update, int]], like: torch.Tensor) -> LowRank:
    """One LowRank from updates of column ranges [offset, offset + out) of one output."""
    a_t = torch.cat([u.a for u, _ in updates]).t().to(like).contiguous()  # [in, sum of ranks]
    parts, row = [], 0
    for u, offset in updates:
        rank = u.b.shape[1]
        parts.append((row, row + rank, offset, (u.b * u.scaling).t().to(like).contiguous()))
        row += rank
    return LowRank(a_t, parts)


def _add_replacement(where: str, model: nn.Module, weights: AdapterWeights, key: str,
                     tensor: torch.Tensor, like: torch.Tensor) -> None:
    """A tensor of a layer saved whole (modules_to_save): a head layer's weight or bias."""
    module_name, _, param_name = key.rpartition(".")
    backbone = model.backbone
    stripped = strip_prefix(module_name, tuple(getattr(backbone, "weight_prefixes", ())))
    heads = _head_layers(model, stripped)
    if len(heads) != 1 or param_name not in ("weight", "bias"):
        raise AdapterError(
            f"{where}: it saves {key!r} whole (modules_to_save); pooler replaces task-head "
            "layers only (classifier, score, pooler dense), and this model has no such head "
            "layer. Merge the adapter (merge_and_unload) to serve a changed backbone.")
    target = heads[0]
    layer = model.get_submodule(target)
    if isinstance(layer, nn.Linear):
        kind, eps = "linear", 0.0
    elif isinstance(layer, nn.LayerNorm):
        kind, eps = "layer_norm", layer.eps
    else:
        raise AdapterError(f"{where}: {key!r} belongs to pooler's {type(layer).__name__} "
                           f"{target!r}; only linear and layer-norm head layers are replaced.")
    own = getattr(layer, param_name)
    if own is None or own.shape != tensor.shape:
        raise AdapterError(
            f"{where}: {key!r} has shape {tuple(tensor.shape)}, this model's "
            f"{'has none' if own is None else tuple(own.shape)} (e.g. another num_labels).")
    current = weights.replaced.get(target) or Replacement(kind, layer.weight, layer.bias, eps)
    setattr(current, param_name, tensor.to(like).contiguous())
    weights.replaced[target] = current
