"""Seeded tiny folders in the original remote-code layouts of nomic-embed-text (nomic-ai's
NomicBertModel), gte-*-v1.5 (Alibaba's NewModel) and jina-embeddings-v3 (XLMRobertaLoRA), as
their hub repositories carry them: config.json keys with `auto_map`, and weight names.

Each starts from a transformers 5.24 model (the reference) and rewrites its folder into the
remote layout; the weights' values are the reference's (Jina: plus LoRA adapters).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.models.rotary_folders import build_family

JINA_TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification",
              "text-matching"]


def _rewrite_config(folder: Path, config: dict) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def build_nomic_remote(folder: Path, seed: int = 0):
    """nomic-embed-text-v1.5's layout; returns the transformers NomicBertModel reference."""
    model = build_family(folder, "nomic_bert", seed=seed)
    c = model.config
    _rewrite_config(folder, {
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "auto_map": {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert."
                                   "NomicBertConfig",
                     "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert."
                                  "NomicBertModel"},
        "activation_function": "swiglu", "n_embd": c.hidden_size, "n_head": c.num_attention_heads,
        "n_layer": c.num_hidden_layers, "n_inner": c.intermediate_size, "n_positions": 128,
        "layer_norm_epsilon": c.layer_norm_eps, "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "prenorm": False,
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "type_vocab_size": c.type_vocab_size, "vocab_size": c.vocab_size,
        "pad_vocab_size_multiple": 64, "causal": False, "use_flash_attn": True,
        "fused_bias_fc": True, "fused_dropout_add_ln": True, "pad_token_id": 3})
    # transformers 5.24 already saves NomicBert under the remote names (emb_ln, attn.Wqkv,
    # mlp.fc11 / fc12, norm1 / norm2): check, so the test stays about the remote layout.
    names = load_file(folder / "model.safetensors").keys()
    assert "encoder.layers.0.attn.Wqkv.weight" in names and "emb_ln.weight" in names
    return model


def build_gte_remote(folder: Path, seed: int = 0, head: str = "Model",
                     ntk_factor: float | None = None):
    """gte-*-v1.5's NewModel layout (model_type `new`, `rope_theta`, optional NTK
    `rope_scaling`); returns the transformers Gte reference, its rotary frequencies set to the
    NTK ones when ntk_factor is given."""
    model = build_family(folder, "gte", head, seed=seed)
    config = json.loads((folder / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    new_arch = {"Model": "NewModel", "ForSequenceClassification": "NewForSequenceClassification",
                "ForTokenClassification": "NewForTokenClassification"}[head]
    config.update(architectures=[new_arch], model_type="new", rope_theta=theta,
                  layer_norm_type="layer_norm", position_embedding_type="rope",
                  logn_attention_scale=False, unpad_inputs=True, pack_qkv=True,
                  use_memory_efficient_attention=True,
                  auto_map={"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                            "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"})
    if ntk_factor is not None:
        config["rope_scaling"] = {"type": "ntk", "factor": ntk_factor}
        backbone = model if head == "Model" else model.gte
        dim = config["hidden_size"] // config["num_attention_heads"]
        base = theta * ntk_factor
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        backbone.rotary_emb.inv_freq.copy_(inv_freq / ntk_factor ** (2 / dim))
    _rewrite_config(folder, config)
    weights = load_file(folder / "model.safetensors")
    assert "encoder.layer.0.mlp.up_gate_proj.weight" in weights or \
        "gte.encoder.layer.0.mlp.up_gate_proj.weight" in weights
    # NewFor* models keep the encoder under `new.`.
    save_file({name.replace("gte.", "new.", 1) if name.startswith("gte.") else name: t
               for name, t in weights.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return model


def build_jina_remote(folder: Path, seed: int = 0, rank: int = 2, alpha: float = 3.0,
                      adapt_token_types: bool = False):
    """jina-embeddings-v3's XLMRobertaLoRA layout: `roberta.` prefix, and every linear and
    embedding weight as `X.parametrizations.weight.original` plus five stacked LoRA adapters
    (adapt_token_types: the one-row token type embedding too, as jina's code adapts every
    nn.Embedding). Returns (the transformers reference with no adapter, the base weights, the
    LoRA factors)."""
    model = build_family(folder, "jina_embeddings_v3", seed=seed)
    c = model.config
    _rewrite_config(folder, {
        "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta",
        "auto_map": {"AutoConfig": "jinaai/xlm-roberta-flash-implementation--"
                                   "configuration_xlm_roberta.XLMRobertaFlashConfig",
                     "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora."
                                  "XLMRobertaLoRA"},
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
        "max_position_embeddings": 128, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 3, "bos_token_id": 0, "eos_token_id": 2,
        "position_embedding_type": "rotary", "rotary_emb_base": 20000.0,
        "lora_adaptations": JINA_TASKS, "lora_rank": rank, "lora_alpha": alpha,
        "lora_dropout_p": 0.0, "lora_main_params_trainable": False,
        "task_instructions": {"retrieval.query": "Represent the query for retrieving "
                                                 "evidence documents: "},
        "use_flash_attn": True, "emb_pooler": None, "load_trained_adapters": True})
    base = load_file(folder / "model.safetensors")
    torch.manual_seed(seed + 100)
    out, factors = {}, {}
    for name, tensor in base.items():
        lora = name.endswith(".weight") and (
            ".mixer." in name or ".mlp." in name or "word_embeddings" in name
            or (adapt_token_types and "token_type_embeddings" in name))
        if not lora:
            out["roberta." + name] = tensor
            continue
        stem = "roberta." + name[: -len(".weight")] + ".parametrizations.weight"
        n = len(JINA_TASKS)
        if "embeddings" in name:  # embeddings: A [vocab, rank], B [rank, hidden]
            a = torch.randn(n, tensor.shape[0], rank) * 0.3
            b = torch.randn(n, rank, tensor.shape[1]) * 0.3
        else:  # linear: A [rank, in], B [out, rank]
            a = torch.randn(n, rank, tensor.shape[1]) * 0.3
            b = torch.randn(n, tensor.shape[0], rank) * 0.3
        out[stem + ".original"], out[stem + ".0.lora_A"], out[stem + ".0.lora_B"] = tensor, a, b
        factors[name] = (a, b)
    save_file(out, folder / "model.safetensors", metadata={"format": "pt"})
    return model, base, factors


def jina_reference_with_adapter(model, base: dict, factors: dict, task: str, alpha: float,
                                rank: int):
    """The transformers reference with adapter `task` merged, from jina's definition:
    W + alpha / rank * B @ A (embeddings: A @ B)."""
    import transformers

    index = JINA_TASKS.index(task)
    merged = dict(base)
    for name, (a, b) in factors.items():
        delta = a[index] @ b[index] if "embeddings" in name else b[index] @ a[index]
        merged[name] = base[name] + alpha / rank * delta
    ref = transformers.JinaEmbeddingsV3Model(model.config).eval()
    # Load through transformers' own renaming (it reads the remote names).
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        save_file(merged, Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        ref = transformers.JinaEmbeddingsV3Model.from_pretrained(tmp).eval()
    return ref
