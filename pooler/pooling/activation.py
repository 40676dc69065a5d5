"""Which function turns a classifier's logits into scores, as the model folder declares it.

Order of precedence:
1. a sentence-transformers CrossEncoder folder's `activation_fn` (v6 writes it to
   config_sentence_transformers.json, v4-v5 to config.json `sentence_transformers.activation_fn`,
   pre-v4 to config.json `sbert_ce_default_activation_function`), because sentence-transformers
   is the reference library for those folders;
2. the transformers text-classification pipeline's rule: `problem_type == "regression"` -> none,
   `"multi_label_classification"` or one label -> sigmoid, otherwise softmax.
`use_activation=False` on a request skips the function and returns raw logits.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

# sentence-transformers stores the torch class path; only torch.* classes are trusted there too.
_ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Softmax": "softmax",
    "torch.nn.modules.activation.Tanh": "tanh",
}

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sigmoid": torch.sigmoid,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "identity": lambda x: x,
    "tanh": torch.tanh,
}


def num_labels_of(hf_config: dict) -> int:
    id2label = hf_config.get("id2label")
    if id2label:
        return len(id2label)
    return int(hf_config.get("num_labels", 2))


def labels_of(hf_config: dict) -> list[str]:
    """Label names by index: `id2label`, else LABEL_i as transformers names them."""
    raw = {int(k): v for k, v in (hf_config.get("id2label") or {}).items()}
    return [raw.get(i, f"LABEL_{i}") for i in range(num_labels_of(hf_config))]


def sequence_activation(hf_config: dict, st_config: dict[str, Any] | None = None) -> str:
    """Name of the activation a sequence classifier's logits go through (see module doc).
    st_config: the folder's config_sentence_transformers.json, if any."""
    st = hf_config.get("sentence_transformers")
    path = (st_config or {}).get("activation_fn")
    path = path or (st.get("activation_fn") if isinstance(st, dict) else None)
    path = path or hf_config.get("sbert_ce_default_activation_function")
    if path:
        if path not in _ST_ACTIVATIONS:
            raise ValueError(
                f"The folder declares the CrossEncoder activation {path!r}, which pooler does "
                f"not implement; supported: {sorted(_ST_ACTIVATIONS)}. Edit activation_fn in "
                "config_sentence_transformers.json (or config.json), or request raw logits "
                "with use_activation=False.")
        return _ST_ACTIVATIONS[path]
    problem_type = hf_config.get("problem_type")
    if problem_type == "regression":
        return "identity"
    if problem_type == "multi_label_classification" or num_labels_of(hf_config) == 1:
        return "sigmoid"
    return "softmax"


def token_activation(hf_config: dict) -> str:
    """Per-token activation: softmax over labels, sigmoid when there is a single label."""
    return "sigmoid" if num_labels_of(hf_config) == 1 else "softmax"


def apply_activation(name: str, logits: torch.Tensor, use_activation: bool) -> torch.Tensor:
    """logits: [..., num_labels], computed in fp32 whatever the model dtype."""
    logits = logits.float()
    return ACTIVATIONS[name](logits) if use_activation else logits
