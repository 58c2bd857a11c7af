"""Runner work a request needs (a checkpoint, the weights), done on the sampling thread.

The thread that calls ``runner.sample()`` takes queued tasks when it polls the served env,
i.e. between two steps, so a task never runs while a step is in flight (a checkpoint never
holds half of a step's statistics, inference never races the sampler's connectors). When
no poll takes a task within the timeout (nothing is sampling, or one step takes that long),
the task is withdrawn, so it never runs later nor on the waiting thread, and the request
fails with ``RunnerUnavailable`` (HTTP 503). The server waits in an executor thread, never
on its event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlconnect.envs.external import EpisodeHub

__all__ = ["RunnerUnavailable", "run_in_sampler"]

#: once a poll took a task, how many times the timeout its result may take (a checkpoint)
_RUN_FACTOR = 10


class RunnerUnavailable(RuntimeError):
    """No sampling step took a request's runner work in time (HTTP 503)."""


def run_in_sampler(hub: EpisodeHub, fn: Callable[[], Any], what: str, timeout_s: float) -> Any:
    """``fn()`` (work on the server's runner), run by the sampling thread between two
    steps; its result."""
    reply = hub.submit(fn)  # EnvError when the server is stopping
    event = reply.event
    assert event is not None  # a reply without a notify callback has one
    # not taken by a poll in time: withdrawn, so it never runs later
    if not event.wait(timeout_s) and hub.withdraw(reply):
        raise RunnerUnavailable(
            f"{what}: the runner took no step within {timeout_s:g} s "
            "(get_action_timeout_s); it is done between two sampling steps, so some "
            "thread must be calling server.runner.sample() (or use "
            "RunnerConfig(sample_async=True))"
        )
    # taken by a poll: it runs on the sampling thread, never here
    if not event.wait(timeout_s * _RUN_FACTOR):
        raise TimeoutError(
            f"{what}: the sampling thread took it but did not finish within "
            f"{timeout_s * _RUN_FACTOR:g} s"
        )
    if reply.error is not None:
        raise reply.error
    return reply.value
