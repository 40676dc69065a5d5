"""The words that switch a setting on or off, wherever pooler reads one from the environment or
a peer's command line (POOLER_CPU_KERNELS=0, POOLER_PRUNE_LAST_LAYER=off, HF_HUB_OFFLINE=1,
--auto-truncate false): one list, so that every switch takes the same spellings."""
from __future__ import annotations

import os

ON_WORDS = ("1", "true", "yes", "on")
OFF_WORDS = ("0", "false", "no", "off")


def is_off(text: str) -> bool:
    """Whether `text` (any case, surrounding spaces ignored) is one of OFF_WORDS."""
    return text.strip().lower() in OFF_WORDS


def is_on(text: str) -> bool:
    """Whether `text` (any case, surrounding spaces ignored) is one of ON_WORDS."""
    return text.strip().lower() in ON_WORDS


def env_off(name: str) -> bool:
    """Whether environment variable `name` is set to one of OFF_WORDS (unset: False)."""
    return is_off(os.environ.get(name, ""))
