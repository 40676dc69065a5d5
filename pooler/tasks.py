"""Pooling task names and the task sets the runners reason about."""
from typing import Literal, get_args

PoolingTask = Literal["embed", "classify", "token_embed", "token_classify"]

POOLING_TASKS: tuple[str, ...] = get_args(PoolingTask)
TOKEN_TASKS: frozenset[str] = frozenset({"token_embed", "token_classify"})

# Order used to pick a model's default task when none is given explicitly.
TASK_PREFERENCE: tuple[str, ...] = ("embed", "classify", "token_embed", "token_classify")


def check_task(task: str) -> str:
    if task not in POOLING_TASKS:
        raise ValueError(
            f"Unknown task: {task!r}. Valid tasks: {sorted(POOLING_TASKS)}.")
    return task
