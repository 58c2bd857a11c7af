"""Waiting for the other side of a poll without falling asleep at once.

A process blocked reading a pipe sleeps, and its CPU goes idle. On the virtual machines
these benchmarks run on an idle virtual CPU halts (the guest's halt polling is off), so
waking the reader costs tens of microseconds: the hypervisor must wake the CPU before the
scheduler can run the process (``benchmarks/bench_worker_poll.py``: "until worker runs").
With CartPole that is a tenth of a poll, paid by every worker in every poll.

So a worker with a CPU of its own (``affinity.CorePin``) that has answered a poll does not
go straight back to its pipe: it watches a counter in the shared block that the runner
bumps right after writing the next poll command, giving the CPU away at each look
(``sched_yield``: the runner, or anything else runnable there, goes first), for at most
``LINGER_S``. When the counter moves, the command is already in the pipe and is read
without sleeping; when the budget runs out (a slow policy, a runner that stopped polling),
the worker blocks on its pipe as before. A worker that shares its CPU never lingers.
EnvPool's threads wait in the same two stages.

The counter only decides when to read the pipe, never what is read: a stale or torn value
costs at most a sleep, never a lost or doubled command.
"""

from __future__ import annotations

import time

import numpy as np

from rlconnect.envs.yielding import yield_until

__all__ = ["LINGER_S", "linger"]

LINGER_S = 0.0005
"""How long an idle worker watches for the next poll before it sleeps on its pipe. A
little more than a fast runner's own work per poll (CartPole at N=64 with a random policy:
about 0.15 ms on this project's 2-core machines), so a worker stays awake between the
polls of a busy runner and costs nothing but yields when the runner is slow."""


def linger(counter: np.ndarray, index: int, seen: int, budget_s: float = LINGER_S) -> bool:
    """Whether ``counter[index]`` passed ``seen`` within ``budget_s`` seconds, looking
    again after each yield of the CPU (``yielding.yield_until``)."""
    return yield_until(time.perf_counter() + budget_s, lambda: counter[index] > seen)
