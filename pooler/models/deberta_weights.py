"""Checkpoint names of DeBERTa (v1) and DeBERTa-v2/v3 -> pooler/models/deberta.py's parameters.

Our attention keeps query, key and value in one fused `qkv_proj` (slots 0, 1, 2). v1 stores them
as one bias-free `in_proj` laid out head by head ([q_h, k_h, v_h] per head) plus `q_bias` and
`v_bias`, and its c2p projection `pos_proj` has no bias: those are reordered and zero-filled here.
Checkpoints may carry `position_embeddings` the config turns off (position_biased_input=false);
those are left unconsumed, as transformers ignores them.
"""
from __future__ import annotations

import re
from typing import Iterable

import torch
from torch import nn

_LAYER = r"^encoder\.layer\.(\d+)\."
# checkpoint name (prefix stripped) -> (our name, slot in the fused q/k/v tensor or None)
_RENAMES = [(re.compile(p), r, s) for p, r, s in [
    (r"^embeddings\.(.+)$", r"embeddings.\1", None),
    (r"^encoder\.rel_embeddings\.weight$", "rel_embeddings.weight", None),
    (r"^encoder\.LayerNorm\.(weight|bias)$", r"rel_norm.\1", None),
    (r"^encoder\.conv\.(.+)$", r"conv.\1", None),
    (_LAYER + r"attention\.self\.query_proj\.(weight|bias)$", r"layers.\1.attention.qkv_proj.\2", 0),
    (_LAYER + r"attention\.self\.key_proj\.(weight|bias)$", r"layers.\1.attention.qkv_proj.\2", 1),
    (_LAYER + r"attention\.self\.value_proj\.(weight|bias)$", r"layers.\1.attention.qkv_proj.\2", 2),
    (_LAYER + r"attention\.self\.(pos_key_proj|pos_query_proj)\.(weight|bias)$",
     r"layers.\1.attention.\2.\3", None),
    # v1
    (_LAYER + r"attention\.self\.q_bias$", r"layers.\1.attention.qkv_proj.bias", 0),
    (_LAYER + r"attention\.self\.v_bias$", r"layers.\1.attention.qkv_proj.bias", 2),
    (_LAYER + r"attention\.self\.pos_proj\.weight$", r"layers.\1.attention.pos_key_proj.weight",
     None),
    (_LAYER + r"attention\.self\.pos_q_proj\.(weight|bias)$",
     r"layers.\1.attention.pos_query_proj.\2", None),
    # both
    (_LAYER + r"attention\.output\.dense\.(weight|bias)$", r"layers.\1.attn_out.\2", None),
    (_LAYER + r"attention\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.attn_norm.\2", None),
    (_LAYER + r"intermediate\.dense\.(weight|bias)$", r"layers.\1.up_proj.\2", None),
    (_LAYER + r"output\.dense\.(weight|bias)$", r"layers.\1.down_proj.\2", None),
    (_LAYER + r"output\.LayerNorm\.(weight|bias)$", r"layers.\1.mlp_norm.\2", None),
]]
_V1_IN_PROJ = re.compile(_LAYER + r"attention\.self\.in_proj\.weight$")


def _v1_qkv_rows(in_proj: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[3 * inner, hidden] laid out [q_h, k_h, v_h] per head -> [q; k; v] (all heads each)."""
    rows, hidden = in_proj.shape
    return in_proj.view(num_heads, 3, rows // (3 * num_heads), hidden).transpose(0, 1) \
        .reshape(rows, hidden)


def load_deberta_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    params = dict(model.named_parameters())
    consumed: set[str] = set()
    loaded: set[str] = set()  # our names, "name#slot" for a slot of a fused tensor

    def put(name: str, target: str, slot: int | None, tensor: torch.Tensor) -> None:
        param = params[target]
        dest = param if slot is None else param[slot * (param.shape[0] // 3):
                                                (slot + 1) * (param.shape[0] // 3)]
        if dest.shape != tensor.shape:
            raise ValueError(f"DeBERTa backbone: checkpoint tensor {name!r} has shape "
                             f"{tuple(tensor.shape)}, the model expects {tuple(dest.shape)}; "
                             "does config.json match the weights?")
        with torch.no_grad():
            dest.copy_(tensor)
        consumed.add(name)
        loaded.add(target if slot is None else f"{target}#{slot}")

    for name, tensor in weights:
        match = _V1_IN_PROJ.match(name)
        if match:
            target = f"layers.{match.group(1)}.attention.qkv_proj.weight"
            if target in params:
                put(name, target, None, _v1_qkv_rows(tensor, model.config.num_attention_heads))
                for slot in range(3):
                    loaded.add(f"{target}#{slot}")
            continue
        for pattern, repl, slot in _RENAMES:
            if pattern.match(name):
                target = pattern.sub(repl, name)
                if target in params:  # e.g. unused position_embeddings stay unconsumed
                    put(name, target, slot, tensor)
                break
    if model.config.v1:  # v1 has no key bias and no c2p projection bias: zeros
        for target, param in params.items():
            if target.endswith("qkv_proj.bias") and f"{target}#0" in loaded:
                with torch.no_grad():
                    param[param.shape[0] // 3:2 * param.shape[0] // 3].zero_()
                loaded.add(f"{target}#1")
            if target.endswith("pos_key_proj.bias"):
                with torch.no_grad():
                    param.zero_()
                loaded.add(target)
    expected = {n for n in params if "qkv_proj" not in n} | {
        f"{n}#{s}" for n in params if "qkv_proj" in n for s in range(3)}
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"DeBERTa backbone: the checkpoint is missing weights for "
                         f"{missing[:10]}{' ...' if len(missing) > 10 else ''}.")
    return consumed
