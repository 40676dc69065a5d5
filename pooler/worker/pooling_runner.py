"""The pooling runner: which tasks this model may serve, and turning hidden states into outputs.

Token-level tasks need every token of a sequence in one unchunked forward pass, which only
encoder-only models guarantee; the runner therefore gates tasks by the model's attention type.
"""
from __future__ import annotations

import torch

from pooler.config import ModelConfig
from pooler.lora.manager import StepLora
from pooler.lora.pooling import pool_per_adapter
from pooler.params import PoolingParams
from pooler.pooling.metadata import PoolingMetadata
from pooler.pooling.token_pooling import pool_requests
from pooler.tasks import POOLING_TASKS, TOKEN_TASKS
from pooler.worker.late_interaction import LateInteractionRunner


class PoolingRunner:
    _SUPPORTED_TASKS = frozenset(POOLING_TASKS)
    _TOKEN_TASKS = TOKEN_TASKS

    def __init__(self, model_config: ModelConfig, pooler):
        self.model_config = model_config
        self.pooler = pooler
        model_tasks = frozenset(pooler.get_supported_tasks())
        enabled = self._get_enabled_tasks(model_config)
        selected = model_config.selected_task
        if selected not in enabled:
            raise ValueError(self._gating_error(
                f"Task {selected!r} is not enabled for this model", enabled, selected,
                model_tasks))
        self.supported_tasks = model_tasks & enabled
        if not self.supported_tasks:
            raise ValueError(self._gating_error(
                "This model supports none of the enabled tasks", enabled, selected, model_tasks))
        self.selected_task = selected
        self.request_params: dict[str, PoolingParams] = {}
        # ColBERT scoring (query cache + MaxSim) is composed in, not written into pool().
        self.late_interaction = LateInteractionRunner()

    @classmethod
    def _get_enabled_tasks(cls, model_config: ModelConfig) -> frozenset[str]:
        if model_config.attn_type == "encoder_only":
            return cls._SUPPORTED_TASKS
        return cls._SUPPORTED_TASKS - cls._TOKEN_TASKS

    def _gating_error(self, what: str, enabled: frozenset[str], selected: str,
                      model_tasks: frozenset[str]) -> str:
        message = (f"{what}: enabled tasks {sorted(enabled)} (attention type "
                   f"{self.model_config.attn_type!r}), selected task {selected!r}, "
                   f"model tasks {sorted(model_tasks)}.")
        usable = sorted(enabled & model_tasks)
        if usable:
            return (message + f" Set an explicitly supported task: task={usable[0]!r} "
                    f"(supported: {usable}).")
        return (message + " Token-level tasks need unchunked encoder-only prefill; to run this "
                "model anyway, use the transformers fallback runner: runner='transformers' "
                "(`--runner transformers`).")

    # ---- request lifecycle --------------------------------------------------------------
    def add_request(self, req_id: str, pooling_params: PoolingParams) -> None:
        task = pooling_params.task
        if task not in self.supported_tasks:
            raise ValueError(f"Unsupported task: {task!r}. "
                             f"Supported tasks: {sorted(self.supported_tasks)}")
        self.late_interaction.register_request(req_id, pooling_params)
        self.request_params[req_id] = pooling_params

    def on_requests_finished(self, req_ids) -> None:
        self.late_interaction.on_requests_finished(req_ids)
        for req_id in req_ids:
            self.request_params.pop(req_id, None)

    def on_unscheduled_aborted(self, aborted: dict[str, PoolingParams]) -> None:
        """Requests aborted before they ever reached the runner: release what their params
        reserved (a ColBERT doc's use of its cached query)."""
        self.late_interaction.release_unscheduled(aborted)

    def clear(self) -> None:
        """Drop the composed late-interaction state (cached ColBERT queries and their pending
        uses). Called by the model runner's reset_encoder_cache only."""
        self.late_interaction.clear()

    # ---- pooling ------------------------------------------------------------------------
    def pool(self, hidden_states: torch.Tensor, metadata: PoolingMetadata,
             finished_mask: list[bool], lora: StepLora | None = None
             ) -> tuple[list[torch.Tensor | None], dict[str, str]]:
        """hidden_states: [num_tokens, hidden]. Returns one output per request and the
        per-request errors (req_id -> message). With `lora` touching head layers, the heads
        run once per adapter (pooler/lora/pooling.py)."""
        if lora is not None and lora.touches_heads:
            outputs = pool_per_adapter(self.pooler, hidden_states, metadata, lora)
        else:
            outputs = self.pooler(hidden_states, metadata)
        # Hierarchical token pooling of documents' multi-vectors, per request (before MaxSim,
        # so a scored document is scored as it would be stored).
        outputs = pool_requests(outputs, metadata.pooling_params)
        return self.late_interaction.postprocess_pooler_output(
            outputs, metadata.pooling_params, metadata.req_ids, finished_mask)
