"""A request as the engine core sees it: token ids, pooling params, scheduling facts."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from pooler.multimodal.inputs import ImageRequestData
from pooler.params import PoolingParams

_arrival_counter = itertools.count()


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    pooling_params: PoolingParams
    token_type_ids: list[int] | None = None
    # Positions of special tokens ([CLS], [SEP]...) for `skip_special_tokens`; 1 = special.
    special_tokens_mask: list[int] | None = None
    # Leading tokens that belong to an instruction prompt (excluded from pooling when the
    # sentence-transformers Pooling module says include_prompt=False).
    num_prompt_tokens: int = 0
    priority: int = 0  # lower runs first, as in vLLM
    arrival_time: float = field(default_factory=time.monotonic)
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))
    status: RequestStatus = RequestStatus.WAITING
    # When a batch containing this request fails, it is retried in batches at most this big
    # so the failing request is isolated without losing its neighbours' results.
    max_batch_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # An image for the vision tower instead of text (two-tower models, pooler/multimodal).
    image: ImageRequestData | None = None

    @property
    def num_tokens(self) -> int:
        """What the request costs a step's token budget: its tokens, or its image's patches."""
        if self.image is not None:
            return self.image.num_tokens
        return len(self.prompt_token_ids)

    @property
    def sort_key(self) -> tuple[int, float, int]:
        return (self.priority, self.arrival_time, self.arrival_order)


@dataclass
class RequestTiming:
    """When a request was submitted to the engine loop, and when the step that computed it
    started and finished (time.monotonic() seconds)."""
    submitted: float
    started: float
    finished: float

    @property
    def queue_seconds(self) -> float:
        return max(0.0, self.started - self.submitted)

    @property
    def inference_seconds(self) -> float:
        return max(0.0, self.finished - self.started)


@dataclass
class RequestOutput:
    """What the engine core returns for a finished request. `data` is a CPU tensor or None."""
    request_id: str
    data: Any
    num_tokens: int
    error: str | None = None
    status: RequestStatus = RequestStatus.FINISHED
    extra: dict[str, Any] = field(default_factory=dict)
    # Set by the engine loop (for the server's metrics and traces); None when the caller
    # stepped the engine itself.
    timing: RequestTiming | None = None
