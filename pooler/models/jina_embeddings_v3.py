"""Jina embeddings v3: a post-norm rotary XLM-R with biased attention and a plain GELU MLP
(transformers' JinaEmbeddingsV3Model), on the shared block of rotary_encoder.py. The original
`XLMRobertaLoRA` layout loads too, with one of its task adapters merged into the weights
(pooler/remote_layouts.py says which)."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig
from pooler.remote_layouts import OPTIONS_KEY


class JinaEmbeddingsV3Model(RotaryEncoder):
    weight_prefixes = ("roberta.",)

    def __init__(self, hf_config: dict):
        cfg = RotaryEncoderConfig.from_hf(
            hf_config, theta=20_000.0, act="gelu", eps=1e-5, type_vocab=1,
            qkv_bias=True, o_bias=True, gated_mlp=False, gate_up_bias=True, down_bias=True)
        super().__init__(cfg, layout="post_norm")
        options = hf_config.get(OPTIONS_KEY) or {}
        # The LoRA task adapter merged at load time (remote layout only), and its alpha / rank.
        self.lora_index = options.get("lora_index")
        self.lora_scaling = float(options.get("lora_scaling", 1.0))
