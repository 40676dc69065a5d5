"""The server's limits and names, importable without the web stack (the CLI reads their
defaults for `pooler serve --help` without importing FastAPI)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerSettings:
    served_model_name: str | None = None
    api_key: str | None = None
    max_input_items: int = 4096          # inputs in one request (413 above)
    max_payload_bytes: int = 32 * 2**20  # request body size (413 above)
    max_queue: int = 16384               # inputs admitted and unanswered (503 above)
    max_workers: int = 64                # threads running blocking Engine calls
    # The queue in tokens (503 above): a fixed number, or None to derive it from the measured
    # rate: tokens/s x max_queue_seconds (pooler/server/limits.py, TokenAdmission).
    max_queue_tokens: int | None = None
    max_queue_seconds: float = 5.0

    def __post_init__(self):
        for name in ("max_input_items", "max_payload_bytes", "max_queue", "max_workers",
                     "max_queue_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}.")
        if self.max_queue_tokens is not None and self.max_queue_tokens <= 0:
            raise ValueError(f"max_queue_tokens must be positive, got {self.max_queue_tokens}.")
