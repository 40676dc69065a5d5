"""Seeded random BERTs and packed inputs for the C layer stack's tests (test_bert_cpu_kernel.py,
test_large_steps_c_stack.py), and the torch layers they are checked against."""
from __future__ import annotations

import torch

from pooler.models.bert import BertModel
from pooler.models.inputs import ModelInputs


def tiny_bert(act: str = "gelu", hidden: int = 48, heads: int = 3, inter: int = 80,
              seed: int = 0, layers: int = 2) -> BertModel:
    # hidden 48 -> q/k/v 144 = 4.5 panels; inter 80 = 2.5 panels: every GEMM has a tail.
    torch.manual_seed(seed)
    model = BertModel({"vocab_size": 100, "hidden_size": hidden, "num_hidden_layers": layers,
                       "num_attention_heads": heads, "intermediate_size": inter,
                       "hidden_act": act, "max_position_embeddings": 128}).eval()
    with torch.no_grad():  # LayerNorm starts at 1/0: make it matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
    return model


def packed_inputs(lengths: list[int], seed: int = 1) -> ModelInputs:
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return ModelInputs(input_ids=torch.randint(0, 100, (total,), generator=g),
                       positions=torch.cat([torch.arange(n) for n in lengths]),
                       token_type_ids=None, cu_seqlens=cu, seq_lens=lengths,
                       max_seqlen=max(lengths))


def torch_layers(model: BertModel, inputs: ModelInputs) -> torch.Tensor:
    x = model.embed(inputs)
    for layer in model.layers:
        x = layer(x, inputs)
    return x
