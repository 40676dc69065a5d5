"""BGE-M3's three heads on one forward pass: dense, sparse (lexical weights) and ColBERT.

The `embed` pooler of a BGE-M3 folder (pooler/bge_m3_layout.py) wraps the folder's usual
dense pooler. A request whose `PoolingParams.extra["bge_m3"]` names outputs gets a dict with
those of "dense" ([hidden], the folder's CLS + Normalize pooling), "sparse" ([vocab_size]:
max of relu(sparse_linear(h)) per token id, cls/eos/pad/unk zeroed, as FlagEmbedding) and
"colbert" ([seq_len - 1, colbert_dim]: colbert_linear on the tokens after [CLS], L2-normalized);
any other request gets the dense vector alone. The heads run only on the requests (and
tokens) that asked for them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pooler.bge_m3_layout import BGEM3Layout, check_outputs
from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.methods import split_tokens

OUTPUTS_KEY = "bge_m3"


class BGEM3Pooler(nn.Module):
    task = "embed"

    def __init__(self, dense: nn.Module, layout: BGEM3Layout, hidden_size: int,
                 vocab_size: int):
        super().__init__()
        self.dense = dense
        self.layout = layout
        self.vocab_size = vocab_size
        colbert_dim = torch.load(layout.colbert_path, map_location="cpu",
                                 weights_only=True)["weight"].shape[0]
        self.colbert_linear = nn.Linear(hidden_size, colbert_dim)
        self.sparse_linear = nn.Linear(hidden_size, 1)

    @property
    def out_features(self) -> int | None:
        return getattr(self.dense, "out_features", None)

    def load_own_weights(self) -> None:
        """The two heads' state dicts beside the checkpoint (FlagEmbedding's file names)."""
        for module, path in ((self.colbert_linear, self.layout.colbert_path),
                             (self.sparse_linear, self.layout.sparse_path)):
            state = torch.load(path, map_location="cpu", weights_only=True)
            module.load_state_dict({k: v.to(module.weight.dtype) for k, v in state.items()})

    def check_params(self, params: PoolingParams) -> None:
        outputs = params.extra.get(OUTPUTS_KEY)
        if outputs is not None:
            params.extra[OUTPUTS_KEY] = list(check_outputs(outputs))

    @property
    def reads_one_row(self) -> bool:
        """Whether rows_read can answer: the dense pooler's, for steps of dense outputs."""
        return bool(getattr(self.dense, "reads_one_row", False))

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """The dense pooler's rows when no request asks for sparse or ColBERT outputs (those
        read every token), else None."""
        for params in metadata.pooling_params:
            if set(params.extra.get(OUTPUTS_KEY) or ()) - {"dense"}:
                return None
        rows_read = getattr(self.dense, "rows_read", None)
        return None if rows_read is None else rows_read(metadata)

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list:
        dense = self.dense(hidden, metadata)  # one [dim] vector per request
        wanted = [p.extra.get(OUTPUTS_KEY) for p in metadata.pooling_params]
        if not any(wanted):
            return dense
        unused = torch.tensor(self.layout.unused_token_ids, dtype=torch.long,
                              device=hidden.device)
        out: list = []
        for i, tokens in enumerate(split_tokens(hidden, metadata)):  # [seq_len, hidden] each
            if not wanted[i]:
                out.append(dense[i])
                continue
            result = {}
            if "dense" in wanted[i]:
                result["dense"] = dense[i]
            if "sparse" in wanted[i]:
                start, length = metadata.seq_starts[i], metadata.seq_lens[i]
                result["sparse"] = self._lexical_weights(
                    tokens, metadata.input_ids[start:start + length], unused)
            if "colbert" in wanted[i]:
                vectors = self.colbert_linear(tokens[1:])  # [seq_len - 1, colbert_dim]
                result["colbert"] = F.normalize(vectors.float(), dim=-1).to(vectors.dtype)
            out.append(result)
        return out

    def _lexical_weights(self, tokens: torch.Tensor, ids: torch.Tensor,
                         unused: torch.Tensor) -> torch.Tensor:
        """tokens: [seq_len, hidden], ids: [seq_len] -> [vocab_size] weights."""
        weights = torch.relu(self.sparse_linear(tokens)).squeeze(-1).float()  # [seq_len]
        vector = torch.zeros(self.vocab_size, dtype=torch.float32, device=tokens.device)
        vector.scatter_reduce_(0, ids.long(), weights, reduce="amax")
        vector[unused] = 0.0
        return vector
