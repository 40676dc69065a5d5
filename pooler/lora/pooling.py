"""Heads of a step that mixes adapters: run the pooler once per adapter on that adapter's
requests, with that adapter alone active, so a head layer an adapter changes (LoRA on the
classifier, or a classifier saved whole) changes only its own requests' outputs."""
from __future__ import annotations

import torch

from pooler.layers.lora import LoraRows, lora_rows
from pooler.lora.manager import StepLora
from pooler.pooling.metadata import PoolingMetadata


def pool_per_adapter(pooler, hidden: torch.Tensor, metadata: PoolingMetadata,
                     step: StepLora) -> list:
    """hidden: [num_tokens, hidden] -> one output per request, in request order."""
    outputs: list = [None] * metadata.num_reqs
    # (adapter or None for the base, first request, end request); requests are ordered.
    groups = [(None, 0, step.request_bounds[0])] + [
        (adapter, step.request_bounds[i], step.request_bounds[i + 1])
        for i, adapter in enumerate(step.adapters)]
    for adapter, start, end in groups:
        if start == end:
            continue
        indices = list(range(start, end))
        sub = metadata if len(indices) == metadata.num_reqs else metadata.subset(indices)
        rows = None if adapter is None else LoraRows([adapter], [0, None])
        with lora_rows(rows):
            for i, out in zip(indices, pooler(hidden, sub)):
                outputs[i] = out
    return outputs
