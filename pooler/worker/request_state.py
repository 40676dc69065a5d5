"""Per-request bookkeeping shared by every model runner (native and transformers fallback)."""
from __future__ import annotations

from pooler.step_contract import NewRequestData, SchedulerOutput


class RunnerRequestState:
    """Needs `self.pooling_runner` (add_request, on_requests_finished, on_unscheduled_aborted)
    and `self.requests` ({req_id: NewRequestData})."""

    requests: dict[str, NewRequestData]

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
