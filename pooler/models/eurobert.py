"""EuroBERT: a bidirectional Llama (pre-norm RMSNorm, grouped-query attention, SwiGLU, a final
norm; transformers' EuroBertModel), on the shared block of rotary_encoder.py."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig, rope_of


class EuroBertModel(RotaryEncoder):
    weight_prefixes = ("model.",)

    def __init__(self, hf_config: dict):
        d = hf_config
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        theta, factor = rope_of(d, 10_000.0, head_dim)
        attention_bias, mlp_bias = bool(d.get("attention_bias")), bool(d.get("mlp_bias"))
        cfg = RotaryEncoderConfig(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim, hidden_act=d.get("hidden_act", "silu"),
            norm_eps=d.get("rms_norm_eps", 1e-5), rope_theta=theta, rope_factor=factor,
            pre_norm=True, rms_norm=True, type_vocab_size=0, qkv_bias=attention_bias,
            o_bias=attention_bias, gated_mlp=True, gate_up_bias=mlp_bias, down_bias=mlp_bias)
        super().__init__(cfg, layout="pre_norm")
