"""Decides which waiting requests run in the next forward pass.

Pooling requests are prefilled whole in one step (encoders cannot be chunked), so a request is
scheduled once and finishes in the step that computes it. The scheduler packs requests by
priority then arrival until the token budget or `max_num_seqs` is reached. When a batch fails,
its requests are preempted and retried in halves, so one bad request fails alone.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pooler.config import SchedulerConfig
from pooler.engine.request import Request, RequestOutput, RequestStatus
from pooler.params import PoolingParams
from pooler.step_contract import ModelRunnerOutput, NewRequestData, SchedulerOutput


@dataclass(frozen=True)
class QueueStats:
    waiting: int
    waiting_tokens: int
    running: int
    running_tokens: int


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self._waiting: list[tuple[tuple, Request]] = []  # heap keyed by Request.sort_key
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self._finished_since_last_step: set[str] = set()
        self._preempted_since_last_step: set[str] = set()
        self._unscheduled_aborted: dict[str, PoolingParams] = {}
        self._seen_by_runner: set[str] = set()

    # ---- queue management ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"Request id {request.request_id!r} is already in use.")
        if request.num_tokens > self.config.max_num_batched_tokens:
            raise ValueError(
                f"Request {request.request_id!r} has {request.num_tokens} tokens, more than "
                f"max_num_batched_tokens={self.config.max_num_batched_tokens}.")
        self.requests[request.request_id] = request
        self._push(request)

    def _push(self, request: Request) -> None:
        heapq.heappush(self._waiting, (request.sort_key, request))

    def abort_requests(self, request_ids) -> list[str]:
        """Abort waiting requests; returns the ids that were actually aborted."""
        aborted = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.status.is_finished or request in self.running:
                continue
            request.status = RequestStatus.ABORTED
            self._finish(request)
            if req_id not in self._seen_by_runner:
                self._unscheduled_aborted[req_id] = request.pooling_params
            aborted.append(req_id)
        return aborted

    @property
    def num_waiting(self) -> int:
        return sum(1 for _, r in self._waiting if r.status == RequestStatus.WAITING)

    def queue_stats(self) -> QueueStats:
        """Waiting and running requests and their tokens, for metrics. Callable from any
        thread: it reads copies of the lists (a copy is atomic under the GIL), so a reading
        taken while the loop thread steps is a consistent-enough snapshot, never an error."""
        waiting = [r for _, r in list(self._waiting) if r.status == RequestStatus.WAITING]
        running = list(self.running)
        return QueueStats(len(waiting), sum(r.num_tokens for r in waiting),
                          len(running), sum(r.num_tokens for r in running))

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_pending_notifications(self) -> bool:
        return bool(self._finished_since_last_step or self._preempted_since_last_step
                    or self._unscheduled_aborted)

    # ---- one step -----------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(
            finished_req_ids=self._finished_since_last_step,
            preempted_req_ids=self._preempted_since_last_step,
            unscheduled_aborted=self._unscheduled_aborted)
        self._finished_since_last_step, self._preempted_since_last_step = set(), set()
        self._unscheduled_aborted = {}

        token_budget = self.config.max_num_batched_tokens
        max_seqs = self.config.max_num_seqs
        step_loras: set[str] = set()  # distinct LoRA adapters in this step
        while self._waiting and len(self.running) < max_seqs:
            request = self._waiting[0][1]
            if request.status != RequestStatus.WAITING:  # aborted while waiting
                heapq.heappop(self._waiting)
                continue
            if request.num_tokens > token_budget:
                break  # strict priority order: never let a later request jump the queue
            if request.max_batch_size is not None:
                if self.running and len(self.running) >= request.max_batch_size:
                    break
                max_seqs = min(max_seqs, request.max_batch_size)
            lora = request.pooling_params.lora
            if lora is not None and lora not in step_loras:
                if self.config.max_loras is not None and len(step_loras) >= self.config.max_loras:
                    break  # its adapter could not be resident beside the step's others
                step_loras.add(lora)
            heapq.heappop(self._waiting)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._seen_by_runner.add(request.request_id)
            out.scheduled_new_reqs.append(_new_request_data(request))
            out.num_scheduled_tokens[request.request_id] = request.num_tokens
            token_budget -= request.num_tokens
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        scheduled, self.running = self.running, []
        if runner_output.batch_error is not None:
            return self._handle_batch_error(scheduled, runner_output.batch_error)
        results = dict(zip(runner_output.req_ids, runner_output.pooler_outputs))
        outputs = []
        for request in scheduled:
            req_id = request.request_id
            error = runner_output.errors.get(req_id)
            if error is None and req_id not in results:
                error = "internal error: the model runner returned no output for this request"
            request.status = RequestStatus.FAILED if error else RequestStatus.FINISHED
            outputs.append(RequestOutput(req_id, None if error else results[req_id],
                                         request.num_tokens, error, request.status))
            self._finish(request)
        return outputs

    def _handle_batch_error(self, scheduled: list[Request], error: str) -> list[RequestOutput]:
        if len(scheduled) == 1:
            request = scheduled[0]
            request.status = RequestStatus.FAILED
            self._finish(request)
            return [RequestOutput(request.request_id, None, request.num_tokens, error,
                                  RequestStatus.FAILED)]
        half = math.ceil(len(scheduled) / 2)
        for request in scheduled:
            request.status = RequestStatus.WAITING
            request.max_batch_size = half
            self._preempted_since_last_step.add(request.request_id)
            self._push(request)
        return []

    def _finish(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        if request.request_id in self._seen_by_runner:
            self._seen_by_runner.discard(request.request_id)
            self._finished_since_last_step.add(request.request_id)
            self._preempted_since_last_step.discard(request.request_id)


def _new_request_data(request: Request) -> NewRequestData:
    return NewRequestData(request.request_id, request.prompt_token_ids, request.token_type_ids,
                          request.special_tokens_mask, request.num_prompt_tokens,
                          request.pooling_params, request.image)
