"""Seeded random tiny MPNet / DistilBERT / ELECTRA / CamemBERT / Gemma3 models saved with
transformers' save_pretrained (config.json + model.safetensors + tokenizer), for the parity
tests of tests/models/test_encoder_families.py and test_gemma3.py."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.models.tiny_task_models import copy_minilm_tokenizer, minilm_path

# Task kind -> class name suffix.
SUFFIXES = {"base": "Model", "seq": "ForSequenceClassification",
            "token": "ForTokenClassification"}
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _perturb_norms(model: torch.nn.Module) -> None:
    """Random non-trivial norm weights and biases, so a test sees them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)


def _save(model: torch.nn.Module, dest: Path) -> Path:
    _perturb_norms(model)
    model.eval().save_pretrained(dest)
    return dest


def save_mpnet_tokenizer(dest: Path) -> None:
    """MiniLM's WordPiece vocabulary under MPNet's special tokens (<s>=0, <pad>=1, </s>=2),
    saved as the MPNet tokenizer saves itself (tokenizer.json + tokenizer_config.json)."""
    from transformers import MPNetTokenizer

    words = (minilm_path() / "vocab.txt").read_text().splitlines()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = specials + [w for w in words if w not in specials] + ["<mask>"]
    MPNetTokenizer(vocab={w: i for i, w in enumerate(vocab)},
                   model_max_length=512).save_pretrained(dest)


def save_mpnet(dest: Path, kind: str = "base", num_labels: int = 3, seed: int = 0,
               **overrides) -> Path:
    """MPNetModel / MPNetForSequenceClassification / MPNetForTokenClassification."""
    import transformers

    dest.mkdir(parents=True, exist_ok=True)
    save_mpnet_tokenizer(dest)
    vocab_size = len(json.loads((dest / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(seed)
    config = transformers.MPNetConfig(vocab_size=vocab_size, max_position_embeddings=130,
                                      num_labels=num_labels, initializer_range=0.2,
                                      **{**TINY, **overrides})
    return _save(getattr(transformers, "MPNet" + SUFFIXES[kind])(config), dest)


def add_st_modules(folder: Path, pooling: str, normalize: bool, max_seq_length: int = 128,
                   dense: list[tuple[int, int]] = (), prompts: dict | None = None,
                   seed: int = 0) -> None:
    """Make `folder` a sentence-transformers folder: Transformer, Pooling, optional bias-free
    identity Dense layers (in, out) with seeded weights, optional Normalize; and prompts."""
    from safetensors.torch import save_file

    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    config = json.loads((folder / "config.json").read_text())
    hidden = config.get("hidden_size") or config["dim"]  # DistilBERT: dim
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}))
    g = torch.Generator().manual_seed(seed)
    for i, (n_in, n_out) in enumerate(dense):
        name = f"{len(modules)}_Dense"
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps({
            "in_features": n_in, "out_features": n_out, "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity"}))
        save_file({"linear.weight": torch.randn(n_out, n_in, generator=g) * n_in ** -0.5},
                  str(folder / name / "model.safetensors"))
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": name,
                        "type": "sentence_transformers.models.Dense"})
    if normalize:
        (folder / f"{len(modules)}_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)),
                        "path": f"{len(modules)}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": prompts or {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine"}))


def _bert_vocab_model(dest: Path, prefix: str, kind: str, config, seed: int) -> Path:
    import transformers

    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    _save(getattr(transformers, prefix + SUFFIXES[kind])(config), dest)
    copy_minilm_tokenizer(dest)
    return dest


def save_distilbert(dest: Path, kind: str = "base", num_labels: int = 3, seed: int = 0) -> Path:
    """DistilBert{Model,ForSequenceClassification,ForTokenClassification}, MiniLM's WordPiece
    tokenizer (its token_type_ids are ignored by DistilBERT, as transformers ignores them)."""
    from transformers import DistilBertConfig

    config = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                              max_position_embeddings=128, num_labels=num_labels,
                              initializer_range=0.2)
    return _bert_vocab_model(dest, "DistilBert", kind, config, seed)


def save_electra(dest: Path, kind: str = "base", num_labels: int = 3, seed: int = 0,
                 embedding_size: int = 16) -> Path:
    """Electra{Model,ForSequenceClassification,ForTokenClassification} with embeddings
    narrower than the encoder (embeddings_project), MiniLM's WordPiece tokenizer."""
    from transformers import ElectraConfig

    config = ElectraConfig(vocab_size=30522, embedding_size=embedding_size,
                           max_position_embeddings=128, num_labels=num_labels,
                           initializer_range=0.2, **TINY)
    return _bert_vocab_model(dest, "Electra", kind, config, seed)


def save_camembert(dest: Path, kind: str = "base", num_labels: int = 3, seed: int = 0) -> Path:
    """Camembert{Model,ForSequenceClassification,ForTokenClassification} (model_type
    camembert, weights under `roberta.`) with a byte-level BPE tokenizer trained here."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    from tests.models.tiny_task_models import CORPUS

    dest.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(dest))
    # transformers 5 names these vocab / merges (vocab_file / merges_file are ignored).
    tokenizer = transformers.RobertaTokenizer(vocab=str(dest / "vocab.json"),
                                              merges=str(dest / "merges.txt"),
                                              model_max_length=256)
    assert len(tokenizer("a cat sat")["input_ids"]) > 3
    tokenizer.save_pretrained(dest)
    torch.manual_seed(seed)
    config = transformers.CamembertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=258, num_labels=num_labels,
        type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        initializer_range=0.2, **TINY)
    return _save(getattr(transformers, "Camembert" + SUFFIXES[kind])(config), dest)


def hf_outputs(path, cls_name: str, texts, pairs=None) -> list:
    """The transformers reference, one unpadded text at a time: logits if the class has a
    head, else the last hidden state, as numpy [seq_len or 1, ...] per text."""
    import inspect

    import transformers

    model = getattr(transformers, cls_name).from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    accepted = inspect.signature(model.forward).parameters
    out = []
    for i, text in enumerate(texts):
        enc = tokenizer(text, pairs[i] if pairs else None, return_tensors="pt")
        enc = {k: v for k, v in enc.items() if k in accepted}  # DistilBERT: no token types
        with torch.no_grad():
            result = model(**enc)
        out.append((result.logits if hasattr(result, "logits")
                    else result.last_hidden_state)[0].numpy())
    return out


GEMMA3_LAYERS = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def save_gemma3(dest: Path, kind: str = "base", *, bidirectional: bool, sliding_window: int,
                num_labels: int = 2, seed: int = 0, legacy_rope: dict | None = None) -> Path:
    """kind: 'base' (Gemma3TextModel), 'causal' (Gemma3ForCausalLM), 'seq'
    (Gemma3TextForSequenceClassification). Four layers (local, local, global, local), GQA,
    head_dim != hidden / heads, query_pre_attn_scalar != head_dim, random norm weights.
    config.json gets `sliding_window` as the hub writes it (transformers' config rewrites it
    when bidirectional, and would rewrite it again on load) and, with `legacy_rope`, the
    rope_theta / rope_local_base_freq / rope_scaling keys older configs (EmbeddingGemma's) use
    instead of rope_parameters. A whitespace word-level tokenizer over t0..t96 (pad t0)."""
    import transformers

    from tests.models.tiny_task_models import save_word_level_tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        layer_types=GEMMA3_LAYERS, sliding_window=sliding_window, max_position_embeddings=128,
        use_bidirectional_attention=bidirectional, num_labels=num_labels, pad_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})
    cls_name = {"base": "Gemma3TextModel", "causal": "Gemma3ForCausalLM",
                "seq": "Gemma3TextForSequenceClassification"}[kind]
    config.architectures = [cls_name]
    _save(getattr(transformers, cls_name)(config), dest)
    saved = json.loads((dest / "config.json").read_text())
    saved["sliding_window"] = sliding_window
    if legacy_rope is not None:
        del saved["rope_parameters"]
        saved.update(legacy_rope)
    (dest / "config.json").write_text(json.dumps(saved, indent=2))
    save_word_level_tokenizer(dest, 97)
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "model_max_length": 128, "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "t0"}))
    return dest
