"""A PyLate ColBERT folder, written by hand as PyLate 1.6 saves `models.ColBERT(<backbone>,
embedding_size=...)`: the backbone with `[Q] ` / `[D] ` appended to its vocabulary, a
`pylate.models.Dense.Dense` projection in 1_Dense/, the settings in
config_sentence_transformers.json.

By hand rather than through PyLate: PyLate 1.6 pins sentence-transformers 5.3 and fails on 6;
and a folder made only of the backbone's weights plus seeded tensors does not depend on the
installed transformers' initialisation, so PyLate's outputs pre-computed on it stay valid
(tests/references/make_pylate_references.py). Used by the ColBERT tests and `pooler bench`.
"""
from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from safetensors.torch import save_file

# What PyLate 1.6 writes to config_sentence_transformers.json (its defaults).
PYLATE_SETTINGS = {
    "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
    "similarity_fn_name": "MaxSim", "query_prefix": "[Q] ", "document_prefix": "[D] ",
    "query_length": 32, "document_length": 180, "attend_to_expansion_tokens": False,
    "skiplist_words": list(string.punctuation), "do_query_expansion": True,
}


def build_pylate(dest: Path, backbone: Path | None = None, embedding_size: int = 32,
                 seed: int = 0, **settings) -> Path:
    """A PyLate ColBERT folder made from `backbone` (a transformers folder with
    model.safetensors and tokenizer.json; MiniLM by default): `[Q] ` and `[D] ` appended to the
    vocabulary with two seeded embedding rows, a seeded bias-free Dense hidden ->
    `embedding_size`, and `settings` over PyLate's defaults."""
    from safetensors.torch import load_file
    from tokenizers import AddedToken, Tokenizer

    if backbone is None:
        from pooler.bench.common import minilm_path
        backbone = minilm_path()
    dest.mkdir(parents=True, exist_ok=True)
    settings = {**PYLATE_SETTINGS, **settings}
    prefixes = [settings["query_prefix"], settings["document_prefix"]]
    tokenizer = Tokenizer.from_file(str(backbone / "tokenizer.json"))
    new = [p for p in prefixes if p and tokenizer.token_to_id(p) is None]
    tokenizer.add_tokens([AddedToken(p, normalized=True, special=False) for p in new])
    tokenizer.save(str(dest / "tokenizer.json"))

    hf_config = json.loads((backbone / "config.json").read_text())
    state = load_file(str(backbone / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    [name] = [k for k, v in state.items()
              if v.ndim == 2 and v.shape[0] == hf_config["vocab_size"]]
    table = state[name]  # [vocab, hidden]
    rows = table.mean(0) + table.std(0) * torch.randn(len(new), table.shape[1],
                                                      generator=generator)
    state[name] = torch.cat([table, rows.to(table.dtype)])
    save_file({k: v.contiguous() for k, v in state.items()}, str(dest / "model.safetensors"),
              metadata={"format": "pt"})
    hidden = hf_config["hidden_size"]
    hf_config["vocab_size"] += len(new)
    (dest / "config.json").write_text(json.dumps(hf_config, indent=2))

    # PyLate pads queries with the mask token (its query expansion), and saves it as pad_token.
    tokenizer_config = json.loads((backbone / "tokenizer_config.json").read_text())
    if tokenizer_config.get("mask_token"):
        tokenizer_config["pad_token"] = tokenizer_config["mask_token"]
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (dest / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": tokenizer_config.get("model_max_length", 512),
         "do_lower_case": False}, indent=2))
    (dest / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ], indent=2))
    (dest / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2))
    (dest / "1_Dense").mkdir(exist_ok=True)
    (dest / "1_Dense" / "config.json").write_text(json.dumps({
        "in_features": hidden, "out_features": embedding_size, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False},
        indent=2))
    linear = torch.randn(embedding_size, hidden, generator=generator) / hidden ** 0.5
    save_file({"linear.weight": linear}, str(dest / "1_Dense" / "model.safetensors"))
    return dest
