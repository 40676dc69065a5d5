"""Which architectures the native runner implements, and what each can do.

Each architecture name (the `architectures[0]` of config.json) maps to a model family file in
`pooler/models/`, a head kind that decides the pooling tasks, and an attention type. Pure data:
reading a config needs it, so it sits below the models (pooler/loader.py imports the classes).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    family: str      # module under pooler.models
    backbone: str    # class in that module; returns hidden states, never pools
    head: str        # "base" | "seq_cls" | "token_cls" | "mlm"
    attn_type: str   # "encoder_only" | "decoder": the family's; see attention_type()


_ENCODER_HEADS = {"Model": "base", "ForSequenceClassification": "seq_cls",
                  "ForTokenClassification": "token_cls", "ForMaskedLM": "mlm"}


def _encoder_family(family: str, backbone: str, prefixes: tuple[str, ...],
                    suffixes: tuple[str, ...] = tuple(_ENCODER_HEADS)) -> dict[str, ArchSpec]:
    return {prefix + suffix: ArchSpec(family, backbone, _ENCODER_HEADS[suffix], "encoder_only")
            for prefix in prefixes for suffix in suffixes}


# Families whose masked-LM head pooler/pooling/mlm_head.py has no layout for.
_NO_MLM = ("Model", "ForSequenceClassification", "ForTokenClassification")


def _decoder_family(family: str, backbone: str, prefixes: tuple[str, ...]) -> dict[str, ArchSpec]:
    # ForTokenClassification is registered so that the pooling runner's gating (not a missing
    # architecture) explains why it cannot run natively, and points to the fallback runner.
    heads = {"Model": "base", "ForCausalLM": "base", "ForSequenceClassification": "seq_cls",
             "ForTokenClassification": "token_cls"}
    return {prefix + suffix: ArchSpec(family, backbone, head, "decoder")
            for prefix in prefixes for suffix, head in heads.items()}


NATIVE_ARCHITECTURES: dict[str, ArchSpec] = {
    # CamemBERT is RoBERTa (its own class names, the same weights under `roberta.`).
    **_encoder_family("bert", "BertModel", ("Bert", "Roberta", "XLMRoberta", "Camembert")),
    # Mistral is Llama with an optional causal sliding window.
    **_decoder_family("llama", "LlamaModel", ("Llama", "Qwen2", "Qwen3", "Mistral")),
    **_encoder_family("modernbert", "ModernBertModel", ("ModernBert",)),
    **_encoder_family("mpnet", "MPNetModel", ("MPNet",), _NO_MLM),
    **_encoder_family("distilbert", "DistilBertModel", ("DistilBert",), _NO_MLM),
    **_encoder_family("electra", "ElectraModel", ("Electra",), _NO_MLM),
    # Gemma3 text models (EmbeddingGemma is a Gemma3TextModel with bidirectional attention).
    "Gemma3TextModel": ArchSpec("gemma3", "Gemma3TextModel", "base", "decoder"),
    "Gemma3ForCausalLM": ArchSpec("gemma3", "Gemma3TextModel", "base", "decoder"),
    "Gemma3TextForSequenceClassification": ArchSpec("gemma3", "Gemma3TextModel", "seq_cls",
                                                    "decoder"),
    # DeBERTa v1 and v2/v3 share one implementation (pooler/models/deberta.py). No ForMaskedLM:
    # its prediction head is not implemented (the fallback runner serves it).
    **{prefix + suffix: ArchSpec("deberta", "DebertaModel", head, "encoder_only")
       for prefix in ("Deberta", "DebertaV2")
       for suffix, head in (("Model", "base"), ("ForSequenceClassification", "seq_cls"),
                            ("ForTokenClassification", "token_cls"))},
    # Rotary BERT-style encoders on one shared block (pooler/models/rotary_encoder.py); their
    # original remote-code layouts are read as these classes (pooler/remote_layouts.py).
    **_encoder_family("nomic_bert", "NomicBertModel", ("NomicBert",), _NO_MLM),
    **_encoder_family("gte", "GteModel", ("Gte",), _NO_MLM),
    **_encoder_family("jina_embeddings_v3", "JinaEmbeddingsV3Model", ("JinaEmbeddingsV3",),
                      _NO_MLM),
    **_encoder_family("eurobert", "EuroBertModel", ("EuroBert",), _NO_MLM),
    # Stanford ColBERT checkpoints: a BERT encoder plus `linear.weight` (read by the pooler).
    "HF_ColBERT": ArchSpec("bert", "BertModel", "base", "encoder_only"),
    # Image-text models: a text tower (the backbone's forward) and a vision tower whose
    # embeddings share one space (pooler/pooling/two_tower.py, pooler/worker/image_runner.py).
    "CLIPModel": ArchSpec("clip", "CLIPModel", "two_tower", "encoder_only"),
    "SiglipModel": ArchSpec("siglip", "SiglipModel", "two_tower", "encoder_only"),
    "Siglip2Model": ArchSpec("siglip", "Siglip2Model", "two_tower", "encoder_only"),
    # Page retrieval: page images merged into the text sequence, multi-vectors scored by
    # MaxSim (pooler/pooling/colvision.py, pooler/multimodal/colmodernvbert_inputs.py).
    "ColModernVBertForRetrieval": ArchSpec("colmodernvbert", "ColModernVBertModel",
                                           "colvision", "encoder_only"),
}

# Tasks each head kind can serve before the runner's gating by attention type.
HEAD_TASKS: dict[str, frozenset[str]] = {
    "base": frozenset({"embed", "token_embed"}),
    "seq_cls": frozenset({"classify"}),
    "token_cls": frozenset({"token_classify"}),
    "mlm": frozenset({"embed", "token_embed"}),
    # GLiNER span models: span x label scores per request (pooler/pooling/gliner.py).
    "gliner": frozenset({"token_classify"}),
    # Image-text models (CLIP, SigLIP): one vector per text or image.
    "two_tower": frozenset({"embed"}),
    # Page retrieval (ColModernVBert): a vector per token of a query or a page (late
    # interaction).
    "colvision": frozenset({"token_embed"}),
}

# model_type -> architecture, for configs that carry no `architectures` list.
_MODEL_TYPE_DEFAULTS = {"bert": "BertModel", "roberta": "RobertaModel",
                        "xlm-roberta": "XLMRobertaModel", "llama": "LlamaModel",
                        "qwen2": "Qwen2Model", "qwen3": "Qwen3Model",
                        "modernbert": "ModernBertModel", "mpnet": "MPNetModel",
                        "camembert": "CamembertModel", "mistral": "MistralModel",
                        "distilbert": "DistilBertModel", "electra": "ElectraModel",
                        "gemma3_text": "Gemma3TextModel",
                        "deberta": "DebertaModel", "deberta-v2": "DebertaV2Model",
                        "nomic_bert": "NomicBertModel", "gte": "GteModel",
                        "jina_embeddings_v3": "JinaEmbeddingsV3Model",
                        "eurobert": "EuroBertModel", "clip": "CLIPModel",
                        "siglip": "SiglipModel", "siglip2": "Siglip2Model",
                        "colmodernvbert": "ColModernVBertForRetrieval"}


def architecture_of(hf_config: dict) -> str:
    architectures = hf_config.get("architectures") or []
    if architectures:
        return architectures[0]
    model_type = hf_config.get("model_type", "")
    if model_type in _MODEL_TYPE_DEFAULTS:
        return _MODEL_TYPE_DEFAULTS[model_type]
    raise ValueError(
        f"config.json names no architecture and model_type {model_type!r} is unknown. "
        f"Supported architectures: {supported_architectures()}.")


def attention_type(family_attn_type: str, hf_config: dict) -> str:
    """The attention the model actually runs, from its config rather than its class name: a
    decoder family built with `use_bidirectional_attention` (EmbeddingGemma) attends both ways
    over the whole sequence, so it is an encoder for the task gate (token tasks allowed)."""
    if family_attn_type == "decoder" and hf_config.get("use_bidirectional_attention"):
        return "encoder_only"
    return family_attn_type


def supported_architectures() -> list[str]:
    return sorted(NATIVE_ARCHITECTURES)


def get_arch_spec(architecture: str) -> ArchSpec:
    spec = NATIVE_ARCHITECTURES.get(architecture)
    if spec is None:
        raise ValueError(
            f"Architecture {architecture!r} is not implemented by the native runner. "
            f"Supported architectures: {supported_architectures()}. "
            "To run it anyway through transformers, pass runner='transformers' "
            "(`--runner transformers` on the CLI).")
    return spec

