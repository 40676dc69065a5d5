"""The step contract between the scheduler and the model runner.

`SchedulerOutput` says what to run this step and what ended since the last one;
`ModelRunnerOutput` carries one pooled tensor (or an error) per scheduled request back. Both
sides import this module and never each other: the runner depends on the contract, not on the
scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pooler.multimodal.inputs import ImageRequestData
from pooler.params import PoolingParams


@dataclass
class NewRequestData:
    """What the model runner needs of a request scheduled (again) for the first time."""
    req_id: str
    prompt_token_ids: list[int]
    token_type_ids: list[int] | None
    special_tokens_mask: list[int] | None
    num_prompt_tokens: int
    pooling_params: PoolingParams
    # An image for the vision tower (two-tower models); its prompt_token_ids are empty.
    image: ImageRequestData | None = None


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    # Requests that ended (finished, aborted, failed) since the previous step.
    finished_req_ids: set[str] = field(default_factory=set)
    # Requests taken back from the runner to be scheduled again later.
    preempted_req_ids: set[str] = field(default_factory=set)
    # Requests aborted before they were ever scheduled: the runner never saw them, but their
    # params may hold reservations (a ColBERT doc's use of a cached query) to release.
    unscheduled_aborted: dict[str, PoolingParams] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled_new_reqs or self.finished_req_ids
                    or self.preempted_req_ids or self.unscheduled_aborted)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str] = field(default_factory=list)
    # One CPU tensor per request in req_ids (None where that request failed), or a dict of
    # named tensors where the pooler gives several outputs (BGE-M3).
    pooler_outputs: list = field(default_factory=list)
    # Per-request failures (e.g. a ColBERT doc whose query is not cached).
    errors: dict[str, str] = field(default_factory=dict)
    # The whole forward pass failed; every scheduled request gets retried or failed.
    batch_error: str | None = None
