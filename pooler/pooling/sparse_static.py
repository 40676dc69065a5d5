"""Inference-free SPLADE queries: one static weight per vocabulary token, no forward pass.

sentence-transformers' SparseStaticEmbedding (the "query" route of a Router) tokenizes the query
without special tokens and gives each distinct token present its static weight (usually an IDF).
Its folder holds `model.safetensors` with a [vocab] `weight`, or a config `path` to an `idf.json`
({token: weight}); it carries its own tokenizer.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pooler.tokenizer import TextTokenizer
from pooler.model_folder import read_json


class StaticSparseEncoder:
    def __init__(self, folder: Path):
        self.folder = folder
        self.tokenizer = TextTokenizer(folder, read_json(folder / "tokenizer_config.json") or {})
        config = read_json(folder / "config.json") or {}
        idf_path = config.get("path")
        if idf_path is not None and str(idf_path).endswith(".json"):
            self.weight = self._from_idf_json(self._find(idf_path))
        else:
            from pooler.checkpoint import iterate_weights

            state = dict(iterate_weights(folder))
            if "weight" not in state:
                raise ValueError(f"{folder}: SparseStaticEmbedding weights need a 'weight' "
                                 f"tensor; found {sorted(state)}.")
            self.weight = state["weight"].float()  # [vocab]
        limit = self.tokenizer.config.get("model_max_length")
        self.max_length = limit if isinstance(limit, int) and limit < 10**9 else None

    def _find(self, name: str) -> Path:
        for candidate in (Path(name), self.folder / name, self.folder.parent / name):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"{self.folder}: IDF file {name!r} not found next to the module.")

    def _from_idf_json(self, path: Path) -> torch.Tensor:
        idf = json.loads(path.read_text(encoding="utf-8"))
        ids = {}
        for token, weight in idf.items():
            token_id = self.tokenizer.token_to_id(token)
            if token_id is None:
                raise ValueError(f"{path}: token {token!r} is not in the tokenizer vocabulary.")
            ids[token_id] = float(weight)
        weight = torch.zeros(max(ids) + 1 if ids else 0)
        for token_id, w in ids.items():
            weight[token_id] = w
        return weight

    def encode(self, texts: list[str]) -> list[tuple[torch.Tensor, int]]:
        """Per text: ([vocab] weights of the distinct tokens present, number of tokens)."""
        encoded = self.tokenizer.encode_batch(texts, max_length=self.max_length,
                                              add_special_tokens=False)
        out = []
        for enc in encoded:
            vector = torch.zeros_like(self.weight)
            ids = torch.tensor(sorted(set(enc.input_ids)), dtype=torch.long)
            ids = ids[ids < vector.shape[0]]  # ids past an idf.json's last token weigh zero
            vector[ids] = self.weight[ids]
            out.append((vector, len(enc.input_ids)))
        return out
