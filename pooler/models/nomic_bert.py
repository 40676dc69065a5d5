"""NomicBert (nomic-embed-text): a post-norm rotary encoder with a bias-free SwiGLU MLP and
bias-free attention (transformers' NomicBertModel), on the shared block of rotary_encoder.py.
The original remote-code layout (`n_embd`, `Wqkv`, `fc11`/`fc12`, ...) loads too
(pooler/remote_layouts.py)."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig, rope_of
from pooler.remote_layouts import OPTIONS_KEY


class NomicBertModel(RotaryEncoder):
    weight_prefixes = ("nomic_bert.", "bert.")

    def __init__(self, hf_config: dict):
        d = hf_config
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        theta, factor = rope_of(d, 1000.0, head_dim)
        cfg = RotaryEncoderConfig(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=heads, head_dim=head_dim,
            hidden_act=d.get("hidden_act", "silu"), norm_eps=d.get("layer_norm_eps", 1e-12),
            rope_theta=theta, rope_factor=factor, type_vocab_size=d.get("type_vocab_size", 2),
            qkv_bias=False, o_bias=False, gated_mlp=True, gate_up_bias=False, down_bias=False)
        for key, value in (d.get(OPTIONS_KEY) or {}).items():
            setattr(cfg, key, value)
        super().__init__(cfg, layout="post_norm")
