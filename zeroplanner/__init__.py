"""zeroplanner: plan DeepSpeed ZeRO runs (memory, communication, step time, config) before renting GPUs."""

from __future__ import annotations


class ZeroPlannerWarning(UserWarning):
    """Warnings zeroplanner itself emits (tests turn them into errors)."""


__version__ = "0.1.0"
