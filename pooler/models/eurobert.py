"""EuroBERT: a bidirectional Llama (pre-norm RMSNorm, grouped-query attention, SwiGLU, a final
norm; transformers' EuroBertModel), on the shared block of rotary_encoder.py."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig


class EuroBertModel(RotaryEncoder):
    weight_prefixes = ("model.",)

    def __init__(self, hf_config: dict):
        attention_bias = bool(hf_config.get("attention_bias"))
        mlp_bias = bool(hf_config.get("mlp_bias"))
        cfg = RotaryEncoderConfig.from_hf(
            hf_config, theta=10_000.0, act="silu", eps=1e-5, type_vocab=0, eps_key="rms_norm_eps",
            pre_norm=True, rms_norm=True, qkv_bias=attention_bias, o_bias=attention_bias,
            gated_mlp=True, gate_up_bias=mlp_bias, down_bias=mlp_bias)
        cfg.type_vocab_size = 0  # Llama-style embeddings: no token types, whatever the config says
        super().__init__(cfg, layout="pre_norm")
