"""Checkpoint names -> the shared rotary encoder's parameters, for each layout it reads.

Names: `native` (transformers' NomicBert/GTE/JinaEmbeddingsV3 classes: separate q/k/v,
gate/up or fc1/fc2, post_attention_layernorm / post_mlp_layernorm), `eurobert` (Llama names,
pre-norm), and the original remote-code layouts `nomic` (Wqkv, fc11 = up, fc12 = gate,
norm1/norm2, emb_ln), `gte_new` (encoder.layer.N.attention.qkv_proj, up_gate_proj = [up; gate],
attn_ln/mlp_ln) and `jina_lora` (mixer.Wqkv, LoRA parametrizations merged first).
transformers 5.24 writes the remote-code names when it saves these classes, and reads both.
A rule maps one checkpoint tensor to a whole parameter or to slices of a fused one
(q/k/v of `qkv_proj`, gate/up of `mlp_in`); every parameter and slice must be found.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch
from torch import nn

_W = r"\.(weight|bias)$"
_L = r"layers\.(\d+)\."
_EMB = [(r"embeddings\.word_embeddings" + _W, [("embeddings.word_embeddings.{0}", None)]),
        (r"embeddings\.token_type_embeddings" + _W,
         [("embeddings.token_type_embeddings.{0}", None)])]
_HF_ATTN_MLP = [
    (_L + r"self_attn\.(q|k|v)_proj" + _W, [("layers.{0}.attn.qkv_proj.{2}", "{1}")]),
    (_L + r"self_attn\.o_proj" + _W, [("layers.{0}.attn.o_proj.{1}", None)]),
    (_L + r"mlp\.(gate|up)_proj" + _W, [("layers.{0}.mlp.mlp_in.{2}", "{1}")]),
    (_L + r"mlp\.fc1" + _W, [("layers.{0}.mlp.mlp_in.{1}", None)]),
    (_L + r"mlp\.(?:down_proj|fc2)" + _W, [("layers.{0}.mlp.mlp_out.{1}", None)]),
]
_LAYOUT_RULES = {
    "native": _EMB + _HF_ATTN_MLP + [
        (r"embeddings\.LayerNorm" + _W, [("embeddings.norm.{0}", None)]),
        (_L + r"post_attention_layernorm" + _W, [("layers.{0}.attn_norm.{1}", None)]),
        (_L + r"post_mlp_layernorm" + _W, [("layers.{0}.mlp_norm.{1}", None)]),
    ],
    "eurobert": _HF_ATTN_MLP + [
        (r"embed_tokens" + _W, [("embeddings.word_embeddings.{0}", None)]),
        (_L + r"input_layernorm" + _W, [("layers.{0}.attn_norm.{1}", None)]),
        (_L + r"post_attention_layernorm" + _W, [("layers.{0}.mlp_norm.{1}", None)]),
        (r"norm" + _W, [("norm.{0}", None)]),
    ],
    "nomic": _EMB + [
        (r"emb_ln" + _W, [("embeddings.norm.{0}", None)]),
        ("encoder." + _L + r"attn\.Wqkv" + _W, [("layers.{0}.attn.qkv_proj.{1}", None)]),
        ("encoder." + _L + r"attn\.out_proj" + _W, [("layers.{0}.attn.o_proj.{1}", None)]),
        ("encoder." + _L + r"mlp\.fc11" + _W, [("layers.{0}.mlp.mlp_in.{1}", "up")]),
        ("encoder." + _L + r"mlp\.fc12" + _W, [("layers.{0}.mlp.mlp_in.{1}", "gate")]),
        ("encoder." + _L + r"mlp\.fc1" + _W, [("layers.{0}.mlp.mlp_in.{1}", None)]),
        ("encoder." + _L + r"mlp\.fc2" + _W, [("layers.{0}.mlp.mlp_out.{1}", None)]),
        ("encoder." + _L + r"norm1" + _W, [("layers.{0}.attn_norm.{1}", None)]),
        ("encoder." + _L + r"norm2" + _W, [("layers.{0}.mlp_norm.{1}", None)]),
    ],
    "gte_new": _EMB + [
        (r"embeddings\.LayerNorm" + _W, [("embeddings.norm.{0}", None)]),
        (r"encoder\.layer\.(\d+)\.attention\.qkv_proj" + _W,
         [("layers.{0}.attn.qkv_proj.{1}", None)]),
        (r"encoder\.layer\.(\d+)\.attention\.o_proj" + _W, [("layers.{0}.attn.o_proj.{1}", None)]),
        # One tensor, up rows first, then gate rows.
        (r"encoder\.layer\.(\d+)\.mlp\.up_gate_proj" + _W,
         [("layers.{0}.mlp.mlp_in.{1}", "up"), ("layers.{0}.mlp.mlp_in.{1}", "gate")]),
        (r"encoder\.layer\.(\d+)\.mlp\.down_proj" + _W, [("layers.{0}.mlp.mlp_out.{1}", None)]),
        (r"encoder\.layer\.(\d+)\.attn_ln" + _W, [("layers.{0}.attn_norm.{1}", None)]),
        (r"encoder\.layer\.(\d+)\.mlp_ln" + _W, [("layers.{0}.mlp_norm.{1}", None)]),
    ],
    "jina_lora": _EMB + [
        (r"emb_ln" + _W, [("embeddings.norm.{0}", None)]),
        ("encoder." + _L + r"mixer\.Wqkv" + _W, [("layers.{0}.attn.qkv_proj.{1}", None)]),
        ("encoder." + _L + r"mixer\.out_proj" + _W, [("layers.{0}.attn.o_proj.{1}", None)]),
        ("encoder." + _L + r"mlp\.fc1" + _W, [("layers.{0}.mlp.mlp_in.{1}", None)]),
        ("encoder." + _L + r"mlp\.fc2" + _W, [("layers.{0}.mlp.mlp_out.{1}", None)]),
        ("encoder." + _L + r"norm1" + _W, [("layers.{0}.attn_norm.{1}", None)]),
        ("encoder." + _L + r"norm2" + _W, [("layers.{0}.mlp_norm.{1}", None)]),
    ],
}
# Post-norm models read every post-norm layout's names (they never collide): transformers 5.24
# itself saves NomicBert, GTE and Jina v3 under their original remote-code names.
_RULES = {"post_norm": [r for k in ("native", "nomic", "gte_new", "jina_lora")
                        for r in _LAYOUT_RULES[k]],
          "pre_norm": _LAYOUT_RULES["eurobert"]}
_COMPILED = {layout: [(re.compile(p), t) for p, t in rules] for layout, rules in _RULES.items()}


def _part_slices(model: nn.Module, target: str) -> dict[str, slice]:
    """Row ranges of the named slices of a fused parameter."""
    cfg = model.config
    if ".qkv_proj." in target:
        q, k, v = cfg.qkv_sizes
        return {"q": slice(0, q), "k": slice(q, q + k), "v": slice(q + k, q + k + v)}
    if ".mlp_in." in target and cfg.gated_mlp:
        i = cfg.intermediate_size
        return {"gate": slice(0, i), "up": slice(i, 2 * i)}
    return {}


def merge_lora(weights: list[tuple[str, torch.Tensor]], index: int | None,
               scaling: float) -> list[tuple[str, torch.Tensor]]:
    """jina-embeddings-v3's LoRA parametrizations (`X.parametrizations.weight.original`,
    `.0.lora_A`, `.0.lora_B`, each adapter stacked on dim 0) -> plain `X.weight` with adapter
    `index` merged: W + scaling * B @ A for linear layers; embeddings store the factors the
    other way round ([vocab, rank] and [rank, hidden]): W + scaling * A @ B."""
    marker = ".parametrizations.weight."
    if not any(marker in n for n, _ in weights):
        return weights
    if index is None:
        raise ValueError("The checkpoint carries LoRA adapters but config.json lists no "
                         "lora_adaptations: the adapter to merge is unknown.")
    by_name = dict(weights)
    out = []
    for name, tensor in weights:
        if marker not in name:
            out.append((name, tensor))
            continue
        if not name.endswith(".original"):
            continue
        stem = name[: -len(".original")]
        if stem + ".0.lora_A" not in by_name or stem + ".0.lora_B" not in by_name:
            raise ValueError(f"LoRA parametrization {stem!r} lacks its lora_A / lora_B tensors.")
        # linear: a [rank, in], b [out, rank]; embedding: a [vocab, rank], b [rank, hidden]
        a = by_name[stem + ".0.lora_A"][index].float()
        b = by_name[stem + ".0.lora_B"][index].float()
        embedding = a.shape[0] == tensor.shape[0] and b.shape[1] == tensor.shape[1]
        delta = a @ b if embedding else b @ a  # the weight's shape either way
        merged = (tensor.float() + scaling * delta.view(tensor.shape)).to(tensor.dtype)
        out.append((stem.replace(".parametrizations.weight", ".weight"), merged))
    return out


def rotary_target(model: nn.Module, name: str) -> str | None:
    """The parameter of `model` (a RotaryEncoder) that checkpoint tensor `name` fills whole,
    None when no rule of its layout reads that name (the task heads' tensors) or when it
    fills slices of a fused parameter."""
    for pattern, targets in _COMPILED[model.layout]:
        match = pattern.fullmatch(name)
        if match is not None:
            template, part = targets[0]
            return template.format(*match.groups()) if len(targets) == 1 and not part \
                else None
    return None


def load_rotary_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Copy the checkpoint into `model` (a RotaryEncoder) by its layout's rules; returns the
    checkpoint names consumed (the rest go to the task heads)."""
    weights = list(weights)
    if model.layout == "post_norm":
        weights = merge_lora(weights, getattr(model, "lora_index", None),
                             getattr(model, "lora_scaling", 1.0))
    rules = _COMPILED[model.layout]
    params = dict(model.named_parameters())
    consumed, loaded = set(), set()
    for name, tensor in weights:
        for pattern, targets in rules:
            match = pattern.fullmatch(name)
            if match is None:
                continue
            chunks = tensor.chunk(len(targets), dim=0) if len(targets) > 1 else (tensor,)
            for (template, part), chunk in zip(targets, chunks):
                target = template.format(*match.groups())
                param = params.get(target)
                if param is None:
                    raise ValueError(f"Checkpoint tensor {name!r} has no place in this model "
                                     f"({target!r}): does config.json match the weights?")
                part = part.format(*match.groups()) if part else None
                dest = param[_part_slices(model, target)[part]] if part else param
                if dest.shape != chunk.shape:
                    raise ValueError(f"Checkpoint tensor {name!r} has shape "
                                     f"{tuple(chunk.shape)}, the model expects "
                                     f"{tuple(dest.shape)}.")
                with torch.no_grad():
                    dest.copy_(chunk)
                loaded.add(f"{target}#{part}" if part else target)
            consumed.add(name)
            break
    expected = set()
    for name in params:
        slices = _part_slices(model, name)
        expected |= {f"{name}#{p}" for p in slices} if slices else {name}
    # A fused parameter loaded whole counts for all its slices.
    loaded |= {f"{n}#{p}" for n in loaded if "#" not in n for p in _part_slices(model, n)}
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"The checkpoint is missing weights for {missing[:10]}"
                         f"{' ...' if len(missing) > 10 else ''} (layout {model.layout!r}).")
    return consumed
