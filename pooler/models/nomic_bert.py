"""NomicBert (nomic-embed-text): a post-norm rotary encoder with a bias-free SwiGLU MLP and
bias-free attention (transformers' NomicBertModel), on the shared block of rotary_encoder.py.
The original remote-code layout (`n_embd`, `Wqkv`, `fc11`/`fc12`, ...) loads too
(pooler/remote_layouts.py)."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig
from pooler.remote_layouts import OPTIONS_KEY


class NomicBertModel(RotaryEncoder):
    weight_prefixes = ("nomic_bert.", "bert.")

    def __init__(self, hf_config: dict):
        cfg = RotaryEncoderConfig.from_hf(
            hf_config, theta=1000.0, act="silu", eps=1e-12, type_vocab=2,
            qkv_bias=False, o_bias=False, gated_mlp=True, gate_up_bias=False, down_bias=False)
        for key, value in (hf_config.get(OPTIONS_KEY) or {}).items():
            setattr(cfg, key, value)
        super().__init__(cfg, layout="post_norm")
