"""The model runner of ColPali and ColQwen2 (page retrieval through transformers' own
`ColPaliForRetrieval` / `ColQwen2ForRetrieval`, pooler/worker/colvision_fallback.py explains
why these two are not native): the same execute_model(scheduler_output) -> ModelRunnerOutput
interface as ModelRunner, with the pooling runner composed in, so late-interaction scoring
(the query cache, MaxSim in the runner, its lifecycle rules) and `pool_factor` work as for
ColModernVBert.

Each request runs alone through transformers (no padding, so an item's vectors do not depend
on its batch): a query from its token ids, a page from the processor's tensors the input side
made (pooler/engine/page_inputs.py). The model's output is already projected and normalized;
the head here only splits it per request and applies `dimensions` / `normalize`. There is no
encoder cache: transformers runs the vision tower inside the forward pass (the input side's mm
cache still keeps each page's processed tensors).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from pooler.config import ModelConfig
from pooler.params import PoolingParams
from pooler.pooling.dispatch import DispatchPooler
from pooler.pooling.heads import finalize_token_embeddings
from pooler.pooling.metadata import PoolingMetadata
from pooler.step_contract import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pooler.worker.colvision_fallback import ColVisionTransformers
from pooler.worker.pooling_runner import PoolingRunner
from pooler.worker.runner_base import ModelRunnerBase

logger = logging.getLogger(__name__)


class ProjectedTokensPooler(nn.Module):
    """token_embed over vectors the model already projected: split per request, then
    `dimensions` / `normalize` per its params."""
    task = "token_embed"

    def __init__(self, embedding_dim: int):
        super().__init__()
        self.out_features = embedding_dim

    def forward(self, hidden: torch.Tensor, metadata: PoolingMetadata) -> list[torch.Tensor]:
        return [finalize_token_embeddings(hidden[s:e], p) for (s, e), p in
                zip(metadata.token_spans(), metadata.pooling_params)]


class ColVisionRunner(ModelRunnerBase):
    def __init__(self, model_config: ModelConfig):
        self.model_config = model_config
        self.device = model_config.torch_device
        self.encoder = ColVisionTransformers(model_config.path, self.device,
                                             model_config.torch_dtype)
        self.model = self.encoder.model
        self.pooler = DispatchPooler({"token_embed": ProjectedTokensPooler(
            self.encoder.embedding_dim)})
        self.pooling_runner = PoolingRunner(model_config, self.pooler)
        self.requests: dict[str, NewRequestData] = {}
        # PaliGemma's forward takes token types (all 0 for a query's text)
        self.takes_token_types = model_config.pages.kind == "colpali"
        logger.warning("Using transformers' %s for page retrieval (one item per forward pass).",
                       model_config.architecture)

    @property
    def supported_tasks(self) -> frozenset[str]:
        return self.pooling_runner.supported_tasks

    def output_size(self, task: str) -> int | None:
        return self.pooler.output_size(task)

    def check_params(self, params: PoolingParams) -> None:
        self.pooler.check_params(params)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.run_step(scheduler_output, self._forward)

    def _forward(self, reqs: list[NewRequestData]) -> tuple[list, dict[str, str]]:
        with torch.inference_mode():
            vectors = [self._embed(r) for r in reqs]  # [num_tokens_i, dim] each
            lens = [v.shape[0] for v in vectors]
            starts = [sum(lens[:i]) for i in range(len(lens))]
            metadata = PoolingMetadata(
                req_ids=[r.req_id for r in reqs], seq_lens=lens, seq_starts=starts,
                num_prompt_tokens=[0] * len(reqs),
                pooling_params=[r.pooling_params for r in reqs],
                special_tokens_masks=[None] * len(reqs))
            outputs, errors = self.pooling_runner.pool(
                torch.cat(vectors), metadata, finished_mask=[True] * len(reqs))
        return [None if o is None else o.detach().to("cpu", copy=True) for o in outputs], errors

    def _embed(self, req: NewRequestData) -> torch.Tensor:
        """One item alone through transformers -> [num_tokens, dim] (every token attended)."""
        ids = torch.tensor([req.prompt_token_ids], dtype=torch.long, device=self.device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if req.image is not None:  # the processor's tensors for this page
            for name, array in req.image.processed.tensors.items():
                inputs[name] = torch.from_numpy(array).to(self.device)
            if inputs["pixel_values"].is_floating_point():
                inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        elif self.takes_token_types:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        return self.model(**inputs).embeddings[0].float()  # [num_tokens, dim]

    def reset_caches(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _swap_weights(self) -> None:
        fresh = ColVisionTransformers(self.model_config.path, "cpu",
                                      self.model_config.torch_dtype).model
        self.model.load_state_dict(fresh.state_dict())
