"""``yield_until``: waiting awake, giving the CPU away at each look.

On the virtual machines these benchmarks run on an idle virtual CPU halts (the guest's
halt polling is off), so a process that sleeps and is woken again costs tens of
microseconds. Where a wait is likely to end within a fraction of a millisecond, looking
again after each ``sched_yield`` keeps the process awake while anything else runnable on
its CPU goes first. Env workers wait so for the next poll (``workers.linger``), the
EnvPool runner for its pool's step before it blocks in ``recv`` (``recv_pacer``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["CAN_YIELD", "yield_until"]

CAN_YIELD = hasattr(os, "sched_yield")
"""Whether the OS lets a process give its CPU away (not on Windows)."""


def yield_until(end: float, ready: Callable[[], bool] | None = None) -> bool:
    """Yield the CPU until ``ready()`` is true (looked at before each yield) or
    ``time.perf_counter()`` reaches ``end``; returns whether ``ready()`` was. Where the OS
    cannot yield it returns False at once: the caller then blocks as it would without it."""
    if not CAN_YIELD:
        return False
    clock = time.perf_counter
    while ready is None or not ready():
        if clock() >= end:
            return False
        os.sched_yield()
    return True
