"""``StepGate``: start a pool's next step as soon as the runner answered every row.

An EnvPool pool steps in C++ threads, so it need not wait for the next ``poll()``: once
every sub-env the last poll returned has its command (an action, or the reset its ended
episode needs) the step can start while the runner still records rows and ends episodes.
The runner asks for the reset of a sub-env whose episode ended only after it acted on the
others, so the gate queues those resets itself when the rows come back; the runner's later
``try_reset`` for them is then a no-op (``take_reset``).

The gate only ever makes a step start earlier: rows the runner dropped, sub-envs it
restarted and episodes its horizon ended leave it shut, and the step starts at the next
``poll()`` as before.

Env worker processes do not use it: with as many workers as CPUs, a worker started while
the runner still works shares a CPU with the runner, and the poll waits for the slower
worker.
"""

from __future__ import annotations

import numpy as np

from rlconnect.envs.rows import EnvRows

__all__ = ["StepGate"]


class StepGate:
    """The sub-envs of ``num_envs`` that a poll returned and that still wait for a command."""

    def __init__(self, num_envs: int) -> None:
        self._waiting = np.zeros(num_envs, dtype=bool)  # returned, no command yet
        self._queued: set[int] = set()  # episode ended: its reset queued here
        self._left = 0  # how many are waiting

    def returned(self, rows: EnvRows) -> np.ndarray:
        """Arm the gate for a poll's dense rows; returns the ids of sub-envs whose episode
        ended there, whose reset the caller queues now (ascending; they wait for nothing)."""
        ids, waiting, done = rows.env_ids, self._waiting, rows.done_envs
        self._queued = set()
        if not rows.dense or not len(ids):
            waiting.fill(False)
            self._left = 0
            return ids[:0]
        if len(ids) == len(waiting):  # every sub-env (a synchronous pool)
            waiting.fill(True)
        else:
            waiting.fill(False)
            waiting[ids] = True
        self._left = len(ids) - len(done)
        if not done:
            return ids[:0]
        self._queued.update(done)
        # dense rows ascend, and so do the sub-envs of done_envs
        ended = np.fromiter(done, np.int64, len(done))
        waiting[ended] = False
        return ended

    def answered(self, env_ids: np.ndarray) -> bool:
        """These sub-envs got their command: whether that was the last one waiting."""
        if not self._left:
            return False
        hit = np.count_nonzero(self._waiting[env_ids])
        if not hit:
            return False
        self._waiting[env_ids] = False
        self._left -= hit
        return not self._left

    def take_reset(self, env_id: int) -> bool:
        """Whether the reset of ``env_id`` was queued by ``returned`` (then the caller has
        nothing left to do for it)."""
        if env_id not in self._queued:
            return False
        self._queued.discard(env_id)
        return True
