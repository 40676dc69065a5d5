"""GTE (gte-multilingual, gte-*-v1.5 and their rerankers): a post-norm rotary encoder with
biased attention and a GeGLU MLP whose down projection alone has a bias (transformers'
GteModel), on the shared block of rotary_encoder.py. Alibaba's original `NewModel` layout
(`qkv_proj`, `up_gate_proj`, `attn_ln`, NTK rope scaling) loads too (pooler/remote_layouts.py).
"""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig, rope_of


class GteModel(RotaryEncoder):
    weight_prefixes = ("gte.", "new.")

    def __init__(self, hf_config: dict):
        d = hf_config
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        theta, factor = rope_of(d, 160_000.0, head_dim)
        cfg = RotaryEncoderConfig(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=heads, head_dim=head_dim,
            hidden_act=d.get("hidden_act", "gelu"), norm_eps=d.get("layer_norm_eps", 1e-12),
            rope_theta=theta, rope_factor=factor, type_vocab_size=d.get("type_vocab_size", 1),
            qkv_bias=True, o_bias=True, gated_mlp=True, gate_up_bias=False, down_bias=True)
        super().__init__(cfg, layout="post_norm")
