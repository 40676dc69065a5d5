"""Builds the model's pooler and routes each request to the pooler of its task."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.params import PoolingParams
from pooler.pooling.classify import build_sequence_classifier, build_token_classifier
from pooler.pooling.heads import DenseProjector
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.poolers import EmbeddingPooler, TokenEmbeddingPooler


class DispatchPooler(nn.Module):
    def __init__(self, poolers: dict[str, nn.Module]):
        super().__init__()
        self.poolers = nn.ModuleDict(poolers)

    def get_supported_tasks(self) -> frozenset[str]:
        return frozenset(self.poolers.keys())

    def output_size(self, task: str) -> int | None:
        """Length of one vector `task` returns (embed: the pooled vector; token_embed: each
        token's), as that task's pooler reports it; None when the model lacks the task or its
        output is not such a vector."""
        pooler = self.poolers[task] if task in self.poolers else None
        return getattr(pooler, "out_features", None)

    def check_params(self, params: PoolingParams) -> None:
        """Raise ValueError (naming the field and the fix) when the task's pooler cannot serve
        these params; poolers opt in with a `check_params` method of their own."""
        pooler = self.poolers[params.task] if params.task in self.poolers else None
        check = getattr(pooler, "check_params", None)
        if check is not None:
            check(params)

    def rows_read(self, metadata: PoolingMetadata) -> list[int] | None:
        """The packed row each request's pooling reads, one per request in request order, when
        every request of the step reads exactly one row of its sequence (a task pooler says so
        with a `rows_read(metadata)` method of its own); None when any reads more (mean or max
        pooling, token tasks, multi-vector and sparse outputs) or its pooler does not say.
        The model runner then lets the backbone compute its last layer on those rows alone
        (ModelInputs.output_rows)."""
        rows: list[int | None] = [None] * metadata.num_reqs
        for task, indices, sub in self._by_task(metadata):
            pooler = self.poolers[task] if task in self.poolers else None
            ask = getattr(pooler, "rows_read", None)
            answer = ask(sub) if ask is not None else None
            if answer is None or len(answer) != len(indices):
                return None
            for i, row in zip(indices, answer):
                start, length = metadata.seq_starts[i], metadata.seq_lens[i]
                if not start <= row < start + length:  # a row outside its own sequence
                    return None
                rows[i] = row
        return rows  # type: ignore[return-value]

    @property
    def reads_one_row(self) -> bool:
        """Whether some task's pooler may read one row per request (rows_read may answer for
        a step of that task): what Engine.step_paths() reports."""
        return any(getattr(p, "reads_one_row", False) for p in self.poolers.values())

    @staticmethod
    def _by_task(metadata: PoolingMetadata) -> list[tuple[str, list[int], PoolingMetadata]]:
        """(task, its requests' indices, their metadata) for each task of the step."""
        by_task: dict[str, list[int]] = {}
        for i, params in enumerate(metadata.pooling_params):
            by_task.setdefault(params.task, []).append(i)
        return [(task, indices, metadata if len(indices) == metadata.num_reqs
                 else metadata.subset(indices)) for task, indices in by_task.items()]

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        """hidden: [num_tokens, hidden] -> one output tensor per request, in request order."""
        outputs: list[torch.Tensor | None] = [None] * metadata.num_reqs
        for task, indices, sub in self._by_task(metadata):
            if task not in self.poolers:
                raise ValueError(f"Unsupported task: {task!r}. "
                                 f"Supported tasks: {sorted(self.poolers.keys())}")
            for i, out in zip(indices, self.poolers[task](hidden, sub)):
                outputs[i] = out
        return outputs  # type: ignore[return-value]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                     model_config: ModelConfig) -> set[str]:
        """Offer checkpoint tensors the backbone did not take to the task heads. `weights`
        may be a lazy iterator: it is not read at all when no head takes weights."""
        loaders = [pooler.load_weights for pooler in self.poolers.values()
                   if hasattr(pooler, "load_weights")]
        if not loaders:
            return set()
        weights = list(weights)
        consumed: set[str] = set()
        for loader in loaders:
            consumed |= loader(weights)
        return consumed


def build_pooler(model_config: ModelConfig, backbone: nn.Module) -> DispatchPooler:
    if model_config.head == "two_tower":
        from pooler.pooling.two_tower import TwoTowerEmbedPooler

        return DispatchPooler({"embed": TwoTowerEmbedPooler(backbone)})
    if model_config.head == "colvision":  # page retrieval (ColModernVBert)
        from pooler.pooling.colvision import build_colvision_poolers

        return DispatchPooler(build_colvision_poolers(model_config, backbone))
    if getattr(model_config, "gliner", None) is not None:
        from pooler.pooling.gliner import GLiNERSpanPooler

        return DispatchPooler({"token_classify": GLiNERSpanPooler(model_config.gliner,
                                                                  model_config.hidden_size)})
    if getattr(model_config, "colbert", None) is not None:
        from pooler.pooling.colbert import build_colbert_poolers

        return DispatchPooler(build_colbert_poolers(model_config, backbone))
    poolers: dict[str, nn.Module] = {}
    tasks = model_config.model_tasks
    st = model_config.st
    if "embed" in tasks:
        if st is not None and st.pooling is not None:
            mode, include_prompt = st.pooling.mode, st.pooling.include_prompt
        else:
            mode, include_prompt = _default_embed_pooling(model_config), True
        projector = DenseProjector(st.dense if st is not None else [])
        poolers["embed"] = EmbeddingPooler(mode, include_prompt, projector,
                                           model_config.hidden_size)
    if "token_embed" in tasks:
        poolers["token_embed"] = TokenEmbeddingPooler(model_config.hidden_size)
    family = _family_poolers(model_config, backbone, poolers)
    poolers.update(family)
    if "classify" in tasks and "classify" not in family:
        poolers["classify"] = build_sequence_classifier(model_config, backbone)
    if "token_classify" in tasks and "token_classify" not in family:
        poolers["token_classify"] = build_token_classifier(model_config)
    return DispatchPooler(poolers)


def _default_embed_pooling(model_config: ModelConfig) -> str:
    """Without a sentence-transformers Pooling module: the last token of a causal decoder (the
    only one that saw the whole text), the mean over a bidirectional decoder (EmbeddingGemma's
    pooling), [CLS] of an encoder."""
    if model_config.decoder_family:
        return "lasttoken" if model_config.attn_type == "decoder" else "mean"
    return "cls"


def _family_poolers(model_config: ModelConfig, backbone: nn.Module,
                    poolers: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Poolers that replace the generic ones for some families and heads (issue 7)."""
    replaced: dict[str, nn.Module] = {}
    if model_config.hf_config.get("model_type") == "modernbert":
        from pooler.pooling.modernbert_heads import modernbert_poolers
        replaced.update(modernbert_poolers(model_config.head, model_config.hf_config))
    if model_config.hf_config.get("model_type") == "eurobert" and model_config.head == "seq_cls":
        from pooler.pooling.eurobert_heads import EuroBertClassifyPooler
        replaced["classify"] = EuroBertClassifyPooler(model_config.hf_config)
    bge_m3 = getattr(model_config, "bge_m3", None)
    if bge_m3 is not None and "embed" in poolers:
        from pooler.pooling.bge_m3 import BGEM3Pooler
        replaced["embed"] = BGEM3Pooler(poolers["embed"], bge_m3, model_config.hidden_size,
                                        int(model_config.hf_config["vocab_size"]))
    if model_config.head == "mlm" and "embed" in poolers:
        from pooler.pooling.sparse import SparseOrDenseEmbedPooler
        replaced["embed"] = SparseOrDenseEmbedPooler(poolers["embed"], model_config, backbone)
    return replaced
