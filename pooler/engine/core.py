"""The engine core: step() = schedule -> execute -> update. It never touches tensors' values."""
from __future__ import annotations

import torch

from pooler.config import EngineConfig
from pooler.engine.request import Request, RequestOutput
from pooler.engine.scheduler import Scheduler
from pooler.worker.model_runner import ModelRunner


class EngineCore:
    def __init__(self, config: EngineConfig):
        self.config = config
        if config.model_config.torch_device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        pages = getattr(config.model_config, "pages", None)
        if pages is not None and pages.runner == "transformers":  # ColPali, ColQwen2
            from pooler.worker.colvision_runner import ColVisionRunner

            self.model_runner = ColVisionRunner(config.model_config)
        elif config.model_config.runner == "transformers":
            from pooler.worker.transformers_runner import TransformersRunner

            self.model_runner = TransformersRunner(config.model_config)
        else:
            self.model_runner = ModelRunner(config.model_config, config.num_threads,
                                            config.scheduler_config.max_num_batched_tokens)
        self.scheduler = Scheduler(config.scheduler_config)

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids) -> list[str]:
        return self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests() or \
            self.scheduler.has_pending_notifications()

    def step(self) -> list[RequestOutput]:
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        runner_output = self.model_runner.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, runner_output)

    def release_memory(self) -> None:
        """Between bursts: give freed heap back to the OS (the runner knows how)."""
        release = getattr(self.model_runner, "release_memory", None)
        if release is not None:
            release()

    def reload_weights(self) -> None:
        self.model_runner.reload_weights()
