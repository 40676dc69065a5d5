"""The masked-language-model head of *ForMaskedLM checkpoints: hidden states -> vocabulary logits.

Every family has the same shape (dense -> activation -> LayerNorm -> decoder to the vocabulary,
with a per-token bias); only the checkpoint names and a few settings differ. The decoder weight
is tied to the input word embeddings unless the checkpoint carries its own.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from pooler.layers.activations import get_activation

# model_type -> (prefix of the head's tensors, transform names, bias names, decoder weight name)
_BERT = ("cls.predictions.", {"transform.dense": "dense", "transform.LayerNorm": "norm"},
         ("bias", "decoder.bias"), "decoder.weight")
_ROBERTA = ("lm_head.", {"dense": "dense", "layer_norm": "norm"}, ("bias", "decoder.bias"),
            "decoder.weight")
_MODERNBERT = ("", {"head.dense": "dense", "head.norm": "norm"}, ("decoder.bias",),
               "decoder.weight")
_LAYOUTS = {"bert": _BERT, "roberta": _ROBERTA, "xlm-roberta": _ROBERTA, "camembert": _ROBERTA,
            "modernbert": _MODERNBERT}


class MLMHead(nn.Module):
    def __init__(self, hf_config: dict, input_embeddings: Callable[[], nn.Embedding]):
        super().__init__()
        model_type = hf_config.get("model_type", "bert")
        if model_type not in _LAYOUTS:
            raise ValueError(f"No masked-LM head layout for model_type {model_type!r}; "
                             f"supported: {sorted(_LAYOUTS)}.")
        self.prefix, self.transform_names, self.bias_names, self.decoder_name = \
            _LAYOUTS[model_type]
        hidden, vocab = hf_config["hidden_size"], hf_config["vocab_size"]
        self.vocab_size = vocab
        if model_type == "modernbert":
            act = hf_config.get("classifier_activation", "gelu")
            eps, norm_bias = hf_config.get("norm_eps", 1e-5), bool(hf_config.get("norm_bias"))
            dense_bias = bool(hf_config.get("classifier_bias", False))
            decoder_bias = bool(hf_config.get("decoder_bias", True))
        else:
            # RoBERTa's head always uses exact GELU; BERT's follows hidden_act.
            act = "gelu" if model_type != "bert" else hf_config.get("hidden_act", "gelu")
            eps, norm_bias = hf_config.get("layer_norm_eps", 1e-12), True
            dense_bias, decoder_bias = True, True
        self.dense = nn.Linear(hidden, hidden, bias=dense_bias)
        self.act = get_activation(act)
        self.norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.bias = nn.Parameter(torch.zeros(vocab)) if decoder_bias else None
        self.decoder_weight: nn.Parameter | None = None  # set when the checkpoint has its own
        # A function, not a submodule: the embedding belongs to the backbone.
        self._input_embeddings = input_embeddings
        self.loaded = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, vocab]
        if not self.loaded:
            raise ValueError("This checkpoint has no masked-LM head weights (e.g. "
                             f"{self.prefix}{next(iter(self.transform_names))}.weight), so it "
                             "cannot produce sparse (SPLADE) embeddings.")
        x = self.norm(self.act(self.dense(hidden)))
        weight = self.decoder_weight if self.decoder_weight is not None \
            else self._input_embeddings().weight
        return F.linear(x, weight, self.bias)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        ours: dict[str, str] = {}
        for ckpt, mine in self.transform_names.items():
            for kind in ("weight", "bias"):
                ours[f"{self.prefix}{ckpt}.{kind}"] = f"{mine}.{kind}"
        for name in self.bias_names:
            ours[self.prefix + name] = "bias"
        params = dict(self.named_parameters())
        consumed, loaded = set(), set()
        for name, tensor in weights:
            if name == self.prefix + self.decoder_name:
                with torch.no_grad():
                    if self.decoder_weight is None:
                        self.decoder_weight = nn.Parameter(tensor.clone(), requires_grad=False)
                    else:
                        self.decoder_weight.copy_(tensor)
                consumed.add(name)
                continue
            target = ours.get(name)
            if target is None or target not in params:
                continue
            with torch.no_grad():
                params[target].copy_(tensor)
            consumed.add(name)
            loaded.add(target)
        # The transform must be complete; a missing bias stays zero as in the reference init.
        needed = {n for n in params if n.startswith(("dense.", "norm."))}
        self.loaded = needed <= loaded
        return consumed
