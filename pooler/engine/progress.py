"""The progress bar of an offline call: tqdm for long jobs (or when asked), else nothing."""
from __future__ import annotations

from tqdm.auto import tqdm

# Offline jobs at least this long show a progress bar unless use_tqdm says otherwise.
TQDM_MIN_INPUTS = 100


class NoProgress:
    """The part of tqdm's interface the engine uses, doing nothing."""

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None


def progress_bar(total: int, use_tqdm: bool | None):
    """A context manager with update(n). A disabled tqdm still costs ~40 us to build: the
    one-query calls skip it."""
    show = use_tqdm if use_tqdm is not None else total >= TQDM_MIN_INPUTS
    return tqdm(total=total, desc="pooling", unit="input") if show else NoProgress()
