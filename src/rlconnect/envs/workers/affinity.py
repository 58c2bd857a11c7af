"""Which CPU an env worker runs on: a CPU of its own while that pays, any CPU when not.

Why pin: in a synchronous poll the runner wakes its workers one after another. Linux puts
a woken process on the CPU it last ran on unless that CPU is busy, and does not move a
process that ran a moment ago (it is "cache hot") to a CPU that goes idle a little later.
So two workers that once ran on the same CPU can step one after another while the other
CPU idles. A scheduler trace (``sched_wakeup`` / ``sched_switch`` events) of 2 workers
stepping 32 CartPole sub-envs each on a 2-core machine showed it: a quarter of the
wake-ups waited about 0.45 ms, the other worker's whole step. Workers pinned to CPUs of
their own never queue behind each other. Sample Factory pins its workers for this reason.

Why let go: a pinned worker cannot leave a CPU that something else keeps busy (another
program, the workers of another runner, the runner itself during asynchronous polls), so
it would step at a fraction of its speed, and every synchronous poll would wait for it.
Each worker therefore compares, over about 0.1 s of its polls, the CPU time it got with
the wall-clock time from the runner's request to its answer (so a wake-up that waited for
a busy CPU counts); when it got less than ``MIN_SHARE`` of it, it lets go (any CPU the
runner may use) and tries its own CPU again after a pause that doubles each time it had
to let go (1 s, 2 s, ... up to 64 s). A group of sub-envs so cheap that the wake-up
dominates its poll is never pinned for long; pinning would not gain it much either.

Workers are pinned only when there is a CPU for each (``num_env_workers`` at most the
CPUs the runner's process may use, ``os.sched_getaffinity``) and the OS supports it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["MIN_SHARE", "CorePin", "worker_cpus"]

MIN_SHARE = 0.75
"""Least share of wall-clock time a pinned worker must get as CPU time to stay pinned."""
WINDOW_S = 0.1
"""Wall-clock seconds of polls over which the share is measured."""
FIRST_PAUSE_S, MAX_PAUSE_S = 1.0, 64.0
"""How long a worker that let go waits before it tries its CPU again (doubling)."""


def worker_cpus(num_workers: int, runner_index: int = 0) -> list[int | None]:
    """The CPU each of ``num_workers`` workers is pinned to: distinct CPUs among those this
    process may use, or None for every worker when there are fewer CPUs than workers (or
    the OS cannot pin). Runner ``k`` of a group (its ``worker_index``) starts at CPU
    ``k * num_workers`` (wrapping), so the runners of one machine spread their workers."""
    if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
        return [None] * num_workers
    allowed = sorted(os.sched_getaffinity(0))
    if num_workers > len(allowed):
        return [None] * num_workers
    first = runner_index * num_workers
    return [allowed[(first + w) % len(allowed)] for w in range(num_workers)]


class CorePin:
    """Keeps the calling process on ``cpu`` while it gets that CPU's time (see the module
    docstring); ``cpu=None`` never pins. ``polled`` is told the wall-clock and CPU seconds
    of every poll."""

    def __init__(self, cpu: int | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cpu = cpu
        self.pinned = False
        self._clock = clock
        self._anywhere = set(os.sched_getaffinity(0)) if cpu is not None else set()
        self._wall = self._cpu = 0.0
        self._pause = FIRST_PAUSE_S
        self._retry_at = 0.0
        if cpu is not None:
            self._set({cpu})

    def polled(self, wall_s: float, cpu_s: float) -> None:
        """Account one poll; at the end of a window, let go of a CPU that is shared, or
        come back to it after the pause."""
        if self.cpu is None:
            return
        if not self.pinned:
            if self._clock() >= self._retry_at:
                self._set({self.cpu})
            return
        self._wall += wall_s
        self._cpu += cpu_s
        if self._wall < WINDOW_S:
            return
        starved = self._cpu < MIN_SHARE * self._wall
        self._wall = self._cpu = 0.0
        if not starved:
            self._pause = FIRST_PAUSE_S
            return
        self._set(self._anywhere)
        self._retry_at = self._clock() + self._pause
        self._pause = min(self._pause * 2, MAX_PAUSE_S)

    def _set(self, cpus: set[int]) -> None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:  # e.g. the CPU was taken away from this process: stop pinning
            self.cpu, self.pinned = None, False
            return
        self.pinned = cpus == {self.cpu}
        self._wall = self._cpu = 0.0
