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
    """Whether every sub-env the last poll returned has a command queued in ``todo`` (the
    pool's mask of sub-envs with an action or reset queued, cleared as it sends)."""

    def __init__(self, todo: np.ndarray) -> None:
        self._todo = todo
        self._armed = False  # a poll's dense rows came back and the step is not sent yet
        self._returned: np.ndarray | None = None  # their sub-envs (None: every one)
        self._queued: set[int] = set()  # episode ended: its reset queued here

    def returned(self, rows: EnvRows) -> np.ndarray:
        """Arm the gate for a poll's dense rows; returns the ids of sub-envs whose episode
        ended there, whose reset the caller queues now (ascending). A poll whose episodes
        all ended leaves nothing to wait for: the next poll sends."""
        ids, done = rows.env_ids, rows.done_envs
        self._queued = set()
        self._armed = rows.dense and len(ids) > len(done)
        if not rows.dense or not len(ids):
            return ids[:0]
        self._returned = None if len(ids) == len(self._todo) else ids
        if not done:
            return ids[:0]
        self._queued.update(done)
        # dense rows ascend, and so do the sub-envs of done_envs
        return np.fromiter(done, np.int64, len(done))

    def answered(self) -> bool:
        """Whether the commands queued so far complete the last poll's rows (True once per
        poll: the gate then shuts until the next one)."""
        if not self._armed:
            return False
        todo, ids = self._todo, self._returned
        if np.count_nonzero(todo) != len(todo) if ids is None else not todo[ids].all():
            return False
        self._armed = False
        return True

    def take_reset(self, env_id: int) -> bool:
        """Whether the reset of ``env_id`` was queued by ``returned`` (then the caller has
        nothing left to do for it)."""
        if env_id not in self._queued:
            return False
        self._queued.discard(env_id)
        return True
