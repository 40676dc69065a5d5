"""Task adapters a model folder carries, served per request: jina-embeddings-v3's LoRA
adapters (`retrieval.query`, `retrieval.passage`, `separation`, `classification`,
`text-matching`, its config's `lora_adaptations`), each a name the engine serves beside the
base, chosen per call (`task=` / `lora=`), per HTTP request (`model`, Cohere's `input_type`)
and mixed in one step.

One adapter is merged into the weights at load (pooler/remote_layouts.py picks it), so a
request that names none runs no low-rank GEMM. Every other adapter is served as its
difference from the merged one: W + s B_m A_m (loaded) + s B_i A_i - s B_m A_m, a low-rank
update of rank 2r ([A_i; A_m] and [B_i, -B_m]) on the adapter's rows, equal to W + s B_i A_i
to fp32 rounding. The merged adapter itself is an empty update: its name is served too.

The checkpoint stores each adapted layer as `X.parametrizations.weight.original` with the
adapters stacked on dim 0: linear `X...0.lora_A` [n, r, in] and `lora_B` [n, out, r];
embeddings the other way round, `lora_A` [n, vocab, r] and `lora_B` [n, r, hidden].
"""
from __future__ import annotations

import torch
from torch import nn

from pooler.checkpoint import iterate_weights, strip_prefix
from pooler.layers.lora import AdapterWeights, LowRank
from pooler.models.rotary_weights import rotary_target
from pooler.remote_layouts import LAYOUT_KEY, OPTIONS_KEY

_PARAMETRIZED = ".parametrizations.weight."
_FACTORS = (".0.lora_A", ".0.lora_B")
# Layers of the original model that pooler's tasks for these folders never run (XLM-R's
# pooler dense, unused by mean-pooled embeddings): their adapters change no output.
_UNUSED_LAYERS = ("pooler.dense",)


def task_adapter_names(hf_config: dict) -> list[str]:
    """The task adapters the folder carries, in its order ([] for any other model)."""
    if hf_config.get(LAYOUT_KEY) != "jina_lora":
        return []
    return list(hf_config.get("lora_adaptations") or [])


def task_instructions(hf_config: dict) -> dict[str, str]:
    """The text the model's own encode(task=...) puts before each input, per task."""
    return {k: v for k, v in (hf_config.get("task_instructions") or {}).items() if v}


def read_task_adapters(model: nn.Module, hf_config: dict, path) -> list[AdapterWeights]:
    """One AdapterWeights per task adapter of the folder at `path` loaded into `model` (a
    PoolingModel), relative to the adapter merged at load; [] when it carries none."""
    names = task_adapter_names(hf_config)
    options = hf_config.get(OPTIONS_KEY) or {}
    merged = options.get("lora_index")
    if not names or merged is None:
        return []
    scaling = float(options.get("lora_scaling", 1.0))
    backbone = model.backbone
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in iterate_weights(path, select=lambda n: _PARAMETRIZED in n
                                        and n.endswith(_FACTORS)):
        stem, part = name[: -len(".0.lora_A")], name[-1]
        factors.setdefault(stem, {})[part] = tensor
    like = next(model.parameters())
    adapters = [AdapterWeights(task) for task in names]
    for stem, pair in sorted(factors.items()):
        weight_name = strip_prefix(stem.replace(".parametrizations.weight", ".weight"),
                                   tuple(getattr(backbone, "weight_prefixes", ())))
        target = rotary_target(backbone, weight_name)
        if target is None:
            if weight_name.startswith(_UNUSED_LAYERS):
                continue
            raise ValueError(f"The task adapters adapt {weight_name!r}, which pooler cannot "
                             "serve per request; pass hf_overrides={'lora_task': ...} to "
                             "serve one adapter merged.")
        key = "backbone." + target.rpartition(".")[0]
        layer = model.get_submodule(key)
        a, b = pair["A"].float(), pair["B"].float()
        embedding = isinstance(layer, nn.Embedding)
        for index, adapter in enumerate(adapters):
            if index != merged:
                adapter.low_rank[key] = _difference(a, b, index, merged, scaling, embedding,
                                                    like)
    return adapters


def _difference(a: torch.Tensor, b: torch.Tensor, index: int, merged: int, scaling: float,
                embedding: bool, like: torch.Tensor) -> LowRank:
    """Adapter `index` minus adapter `merged` as one LowRank of rank 2r."""
    if embedding:  # a: [n, vocab, r], b: [n, r, hidden]; delta = A @ B
        rank = a.shape[2]
        a_t = torch.cat([a[index], a[merged]], dim=1)  # [vocab, 2r]
        b_i, b_m = b[index], b[merged]  # [r, hidden]
    else:  # a: [n, r, in], b: [n, out, r]; delta = B @ A
        rank = a.shape[1]
        a_t = torch.cat([a[index], a[merged]]).t()  # [in, 2r]
        b_i, b_m = b[index].t(), b[merged].t()  # [r, out]
    parts = [(0, rank, 0, (b_i * scaling).to(like).contiguous()),
             (rank, 2 * rank, 0, (b_m * -scaling).to(like).contiguous())]
    return LowRank(a_t.to(like).contiguous(), parts, gather=embedding)

