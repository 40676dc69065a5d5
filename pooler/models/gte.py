"""GTE (gte-multilingual, gte-*-v1.5 and their rerankers): a post-norm rotary encoder with
biased attention and a GeGLU MLP whose down projection alone has a bias (transformers'
GteModel), on the shared block of rotary_encoder.py. Alibaba's original `NewModel` layout
(`qkv_proj`, `up_gate_proj`, `attn_ln`, NTK rope scaling) loads too (pooler/remote_layouts.py).
"""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig


class GteModel(RotaryEncoder):
    weight_prefixes = ("gte.", "new.")

    def __init__(self, hf_config: dict):
        cfg = RotaryEncoderConfig.from_hf(
            hf_config, theta=160_000.0, act="gelu", eps=1e-12, type_vocab=1,
            qkv_bias=True, o_bias=True, gated_mlp=True, gate_up_bias=False, down_bias=True)
        super().__init__(cfg, layout="post_norm")
