"""The long-document step the load-time precision gates time (issue 42): one sequence past the
length where attention leaves its short paths, for a model that takes such documents.

Why a case of its own: the gates' other shapes (a 12- or 64-token query, batches of 128-token
passages) never reach the long attention paths (pooler/layers/attention_long.py, the C kernel's
band), and on a long document attention's share of a layer grows with the length (60% of a
ModernBERT-base layer at 8k tokens in fp32). A precision whose GEMMs win on short steps can
lose there: before the long families' q/k/v reached the bf16 attention kernel, int8 and bf16
ModernBERT ran 1.7x and 2.4x fp32's speed on 2k-token steps' GEMM-heavy mix yet 0.91x and 0.94x
on an 8k document (docs/models/precision.md, "Long documents"), and the gate, timing short
shapes only, kept them.

LONG_STEP_TOKENS is a cost compromise: above BANDED_MIN_LEN / CHUNKED_MIN_LEN, so every long
path runs, and short of 8k, whose forward alone would add seconds per timed call to a
ModernBERT-base load.
"""
from __future__ import annotations

import torch

from pooler.config import ModelConfig
from pooler.layers.attention_long import CHUNKED_MIN_LEN
from pooler.models.inputs import ModelInputs

LONG_STEP_TOKENS = 1536


def long_step_shape(model_config: ModelConfig, vocab_size: int | None = None
                    ) -> tuple[str, ModelInputs] | None:
    """("1x1536 tokens", inputs) for a model whose max_model_len exceeds CHUNKED_MIN_LEN
    (it takes documents the long paths run), else None. Ids are seeded and away from the
    special ids at the start of most vocabularies."""
    longest = model_config.max_model_len or 0
    if longest <= CHUNKED_MIN_LEN:
        return None
    length = min(LONG_STEP_TOKENS, longest)
    vocab = vocab_size or int(model_config.hf_config.get("vocab_size") or 30522)
    generator = torch.Generator().manual_seed(0)
    low = min(1000, vocab // 2)
    ids = torch.randint(low, vocab, (length,), generator=generator)
    device = model_config.torch_device
    inputs = ModelInputs(input_ids=ids.to(device), positions=torch.arange(length).to(device),
                         token_type_ids=None,
                         cu_seqlens=torch.tensor([0, length], dtype=torch.int32, device=device),
                         seq_lens=[length], max_seqlen=length)
    return f"1x{length} tokens", inputs
