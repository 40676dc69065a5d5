"""What every model runner (native and transformers fallback) shares: per-request bookkeeping,
and the one path by which weights change.

Weights change only through `reload_weights`, which swaps them in (`_swap_weights`, per runner)
and then calls both resets. `reset_encoder_cache` is the single entry that drops state computed
from the old weights (the composed late-interaction cache of ColBERT queries, via
`pooling_runner.clear()`), so no query embedded with old weights is ever scored again.
`reset_mm_cache` resets the multimodal input cache only (preprocessed pixels by image hash,
owned by the input side and registered here as `mm_cache`) and deliberately leaves
late-interaction state and the encoder cache alone: it has nothing to do with scoring.
The encoder cache (vision-tower outputs of two-tower models, `image_runner`) is dropped by
`reset_encoder_cache`, with the late-interaction state.
"""
from __future__ import annotations

import logging
import traceback
from typing import Callable

import torch

from pooler.step_contract import ModelRunnerOutput, NewRequestData, SchedulerOutput
from pooler.worker.step_paths import step_paths

logger = logging.getLogger(__name__)


class ModelRunnerBase:
    """Needs `self.pooling_runner` (add_request, on_requests_finished, on_unscheduled_aborted,
    clear) and `self.requests` ({req_id: NewRequestData}); subclasses implement
    `_swap_weights`."""

    requests: dict[str, NewRequestData]
    # The input side's multimodal cache (a ByteLRUCache), registered by the engine; None for
    # text models.
    mm_cache = None
    # Two-tower models' image path with its encoder cache (pooler/worker/image_runner.py).
    image_runner = None

    def step_paths(self) -> dict[str, str]:
        """Each range of step sizes -> the path it takes (pooler/worker/step_paths.py)."""
        return step_paths(getattr(self, "model", None),
                          getattr(self, "device", None) or torch.device("cpu"))

    def finish_requests(self, scheduler_output: SchedulerOutput) -> None:
        # Finished ids go to the pooling runner *before* preempted ids join the removal set:
        # a preempted request keeps its pooling-side reservations until it is rescheduled.
        finished = scheduler_output.finished_req_ids
        self.pooling_runner.on_requests_finished(finished)
        if scheduler_output.unscheduled_aborted:
            self.pooling_runner.on_unscheduled_aborted(scheduler_output.unscheduled_aborted)
        for req_id in finished | scheduler_output.preempted_req_ids:
            self.requests.pop(req_id, None)

    def add_requests(self, new_reqs: list[NewRequestData]) -> None:
        for req in new_reqs:
            self.pooling_runner.add_request(req.req_id, req.pooling_params)
            self.requests[req.req_id] = req

    def run_step(self, scheduler_output: SchedulerOutput,
                 forward: Callable[[list[NewRequestData]], tuple[list, dict[str, str]]]
                 ) -> ModelRunnerOutput:
        """One step of a runner whose forward takes the new requests as they are: finished
        requests out, new ones in, `forward(reqs) -> (outputs on the host, per-request
        errors)`. An exception fails the step as a whole (`batch_error`): the scheduler then
        retries the batch in halves."""
        self.finish_requests(scheduler_output)
        reqs = scheduler_output.scheduled_new_reqs
        if not reqs:
            return ModelRunnerOutput()
        req_ids = [r.req_id for r in reqs]
        try:
            self.add_requests(reqs)
            outputs, errors = forward(reqs)
        except Exception as exc:  # isolate: the scheduler retries the batch in halves
            logger.debug("batch of %d failed: %s", len(reqs), traceback.format_exc())
            return ModelRunnerOutput(req_ids=req_ids, batch_error=f"{type(exc).__name__}: {exc}")
        return ModelRunnerOutput(req_ids=req_ids, pooler_outputs=outputs, errors=errors)

    # ---- weights and the caches derived from them ---------------------------------------
    def reload_weights(self) -> None:
        """Swap the folder's current weights in, then invalidate what the old ones computed."""
        self._swap_weights()
        self.reset_mm_cache()
        self.reset_encoder_cache()

    def reset_encoder_cache(self) -> None:
        """Drop encoder outputs kept across steps: the vision-tower outputs of the encoder
        cache, and the pooling runner's late-interaction cache (ColBERT queries), which is
        cleared here and only here."""
        if self.image_runner is not None:
            self.image_runner.clear()
        self.pooling_runner.clear()

    def reset_mm_cache(self) -> None:
        """Drop the multimodal input cache (preprocessed pixels). Must not touch
        late-interaction state nor the encoder cache (see the module docstring)."""
        if self.mm_cache is not None:
            self.mm_cache.clear()

    def _swap_weights(self) -> None:
        raise NotImplementedError
