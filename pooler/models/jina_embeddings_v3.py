"""Jina embeddings v3: a post-norm rotary XLM-R with biased attention and a plain GELU MLP
(transformers' JinaEmbeddingsV3Model), on the shared block of rotary_encoder.py. The original
`XLMRobertaLoRA` layout loads too, with one of its task adapters merged into the weights
(pooler/remote_layouts.py says which)."""
from __future__ import annotations

from pooler.models.rotary_encoder import RotaryEncoder, RotaryEncoderConfig, rope_of
from pooler.remote_layouts import OPTIONS_KEY


class JinaEmbeddingsV3Model(RotaryEncoder):
    weight_prefixes = ("roberta.",)

    def __init__(self, hf_config: dict):
        d = hf_config
        heads = d["num_attention_heads"]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        theta, factor = rope_of(d, 20_000.0, head_dim)
        cfg = RotaryEncoderConfig(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=heads, head_dim=head_dim,
            hidden_act=d.get("hidden_act", "gelu"), norm_eps=d.get("layer_norm_eps", 1e-5),
            rope_theta=theta, rope_factor=factor, type_vocab_size=d.get("type_vocab_size", 1),
            qkv_bias=True, o_bias=True, gated_mlp=False, gate_up_bias=True, down_bias=True)
        super().__init__(cfg, layout="post_norm")
        options = d.get(OPTIONS_KEY) or {}
        # The LoRA task adapter merged at load time (remote layout only), and its alpha / rank.
        self.lora_index = options.get("lora_index")
        self.lora_scaling = float(options.get("lora_scaling", 1.0))
