"""The original remote-code layouts of nomic-embed-text, gte-*-v1.5 and jina-embeddings-v3,
read as the native classes transformers now defines (NomicBertModel, GteModel,
JinaEmbeddingsV3Model). No repository code runs: their config.json keys are translated here,
their weight names by pooler/models/rotary_weights.py.

- nomic-embed-text (`NomicBertModel` from nomic-ai's remote code): GPT-2 style keys (`n_embd`,
  `n_layer`, `n_head`, `n_inner`, `rotary_emb_base`, `activation_function: swiglu`, ...).
- gte-*-v1.5 / gte-multilingual (Alibaba's `NewModel`, model_type `new`): BERT keys with
  `rope_theta`, `rope_scaling` (NTK) and `layer_norm_type`.
- jina-embeddings-v3 (`XLMRobertaLoRA` / `XLMRobertaFlashConfig`): XLM-R keys with
  `position_embedding_type: rotary` and five LoRA task adapters (`lora_adaptations`). One
  adapter is merged into the weights at load time: `lora_task` (hf_overrides) names it,
  `text-matching` by default, as vLLM does.
Each converted config keeps its layout under `pooler_layout` and any block options the native
config cannot say (biases) under `pooler_rotary_options`.
"""
from __future__ import annotations

LAYOUT_KEY = "pooler_layout"
OPTIONS_KEY = "pooler_rotary_options"
DEFAULT_JINA_TASK = "text-matching"

_NEW_ARCHITECTURES = {"NewModel": "GteModel", "NewForSequenceClassification":
                      "GteForSequenceClassification", "NewForTokenClassification":
                      "GteForTokenClassification"}


def remote_layout_of(hf_config: dict) -> str | None:
    """'nomic', 'gte_new' or 'jina_lora' when config.json is in one of those remote-code
    layouts, else None."""
    if hf_config.get(LAYOUT_KEY):
        return hf_config[LAYOUT_KEY]
    if hf_config.get("model_type") == "nomic_bert" and "n_embd" in hf_config:
        return "nomic"
    if hf_config.get("model_type") == "new":
        return "gte_new"
    if hf_config.get("model_type") == "xlm-roberta" and \
            hf_config.get("position_embedding_type") == "rotary":
        return "jina_lora"
    return None


def to_native_config(hf_config: dict) -> dict:
    """The config in the native family's keys (unchanged when it is in no remote layout)."""
    layout = remote_layout_of(hf_config)
    if layout is None or hf_config.get(LAYOUT_KEY):
        return hf_config
    return {"nomic": _nomic, "gte_new": _gte_new, "jina_lora": _jina}[layout](hf_config)


def _refuse(condition: bool, what: str, fix: str = "") -> None:
    if condition:
        raise ValueError(f"This checkpoint's remote-code config sets {what}, which pooler does "
                         f"not implement natively{fix or '.'}")


def _nomic(d: dict) -> dict:
    hidden = int(d["n_embd"])
    activation = d.get("activation_function", "swiglu")
    if activation not in ("swiglu", "geglu", "gelu"):
        raise ValueError(f"nomic_bert activation_function {activation!r} is not supported "
                         "natively (swiglu, geglu and gelu are).")
    _refuse(bool(d.get("prenorm", False)), "prenorm=true")
    _refuse(float(d.get("rotary_emb_fraction", 1.0)) != 1.0, "rotary_emb_fraction != 1")
    _refuse(bool(d.get("rotary_emb_interleaved", False)), "rotary_emb_interleaved=true")
    _refuse(bool(d.get("rotary_scaling_factor")), "rotary_scaling_factor (dynamic NTK)")
    _refuse(bool(d.get("moe_every_n_layers")), "moe_every_n_layers (mixture of experts)")
    qkv_bias = bool(d.get("qkv_proj_bias", True))
    fc1_bias, fc2_bias = bool(d.get("mlp_fc1_bias", True)), bool(d.get("mlp_fc2_bias", True))
    architectures = ["NomicBertModel" if a in ("NomicBertModel", "NomicBertForPreTraining")
                     else a for a in d.get("architectures") or ["NomicBertModel"]]
    return {
        **{k: v for k, v in d.items() if k in ("id2label", "label2id", "num_labels",
                                                "problem_type", "pad_token_id")},
        "architectures": architectures, "model_type": "nomic_bert",
        "vocab_size": int(d["vocab_size"]), "hidden_size": hidden,
        "num_hidden_layers": int(d["n_layer"]), "num_attention_heads": int(d["n_head"]),
        "intermediate_size": int(d.get("n_inner") or 4 * hidden),
        "max_position_embeddings": int(d.get("n_positions", 2048)),
        "type_vocab_size": int(d.get("type_vocab_size", 2)),
        "layer_norm_eps": float(d.get("layer_norm_epsilon", 1e-12)),
        "hidden_act": {"swiglu": "silu", "geglu": "gelu", "gelu": "gelu"}[activation],
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(d.get("rotary_emb_base", 10000.0))},
        LAYOUT_KEY: "nomic",
        OPTIONS_KEY: {"qkv_bias": qkv_bias, "o_bias": qkv_bias, "gate_up_bias": fc1_bias,
                      "down_bias": fc2_bias, "gated_mlp": activation != "gelu"},
    }


def _gte_new(d: dict) -> dict:
    _refuse(d.get("layer_norm_type", "layer_norm") != "layer_norm",
            f"layer_norm_type={d.get('layer_norm_type')!r}")
    _refuse(bool(d.get("logn_attention_scale", False)), "logn_attention_scale=true")
    _refuse(d.get("position_embedding_type", "rope") not in ("rope", "rotary"),
            f"position_embedding_type={d.get('position_embedding_type')!r}")
    out = {k: v for k, v in d.items() if k not in ("auto_map", "architectures")}
    out["architectures"] = [_NEW_ARCHITECTURES.get(a, a)
                            for a in d.get("architectures") or ["NewModel"]]
    out["model_type"] = "gte"
    out[LAYOUT_KEY] = "gte_new"
    return out


def _jina(d: dict) -> dict:
    adapters = list(d.get("lora_adaptations") or [])
    out = {k: v for k, v in d.items() if k not in ("auto_map", "architectures")}
    out["architectures"] = ["JinaEmbeddingsV3Model"]
    out["model_type"] = "jina_embeddings_v3"
    out["rope_parameters"] = {"rope_type": "default",
                              "rope_theta": float(d.get("rotary_emb_base", 10000.0))}
    out[LAYOUT_KEY] = "jina_lora"
    if adapters:
        task = d.get("lora_task", DEFAULT_JINA_TASK)
        if task not in adapters:
            raise ValueError(f"lora_task {task!r} is not one of this checkpoint's adapters "
                             f"{adapters}; pass hf_overrides={{'lora_task': <one of them>}}.")
        out[OPTIONS_KEY] = {"lora_index": adapters.index(task),
                            "lora_scaling": float(d.get("lora_alpha", 1)) / float(
                                d.get("lora_rank", 4))}
    return out
