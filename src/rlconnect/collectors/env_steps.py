"""``EnvStepLog``: one event per env step (poll, sub-env, episode, agent steps), the
measure by which batches are sized and cut.

A poll adds its steps as one tuple of whole arrays (O(1)); the columns are built when they
are read, or every ``MERGE_EVERY`` polls so that memory grows with steps, not polls.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rlconnect.collectors.store import MERGE_EVERY

__all__ = ["EnvStepLog", "EnvSteps"]


class EnvSteps(NamedTuple):
    """Logged env steps as columns (int64): the poll, sub-env and episode of each, and the
    agent steps (transitions) it completed."""

    poll: np.ndarray
    env: np.ndarray
    eps: np.ndarray
    agent_steps: np.ndarray


_PYTHON_SUM_MAX = 64  # up to this many sub-envs stepped, their agent steps are summed in Python


class EnvStepLog:
    """Env steps in the order they were taken (``columns()``), and how many."""

    def __init__(self) -> None:
        self.size = 0  #: env steps logged
        self.agent_steps = 0  #: transitions they completed
        empty = np.zeros(0, dtype=np.int64)
        self._columns = EnvSteps(empty, empty, empty, empty)
        self._pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray | int]] = []

    def add(
        self, poll: int, env_ids: np.ndarray, eps_ids: np.ndarray, agent_steps: np.ndarray | int
    ) -> None:
        """Sub-envs ``env_ids`` (in episodes ``eps_ids``) stepped at ``poll``; ``agent_steps``:
        the transitions each completed, or one number for all."""
        n = len(env_ids)
        if not n:
            return
        self.size += n
        if type(agent_steps) is int:  # (not isinstance: no call, every poll)
            self.agent_steps += n * agent_steps
        elif n <= _PYTHON_SUM_MAX and isinstance(agent_steps, np.ndarray):
            # a few numbers: Python's sum costs less than a ufunc
            self.agent_steps += sum(agent_steps.tolist())
        else:
            self.agent_steps += int(np.add.reduce(agent_steps))  # (no wrapper: every poll)
        pending = self._pending
        pending.append((poll, env_ids, eps_ids, agent_steps))
        if len(pending) >= MERGE_EVERY:
            self.columns()

    def columns(self) -> EnvSteps:
        """Every logged env step."""
        if self._pending:
            polls, envs, eps, steps = zip(*self._pending)
            self._pending = []
            counts = list(map(len, envs))
            old_polls, old_envs, old_eps, old_steps = self._columns
            self._columns = EnvSteps(
                np.concatenate((old_polls, np.repeat(np.asarray(polls, np.int64), counts))),
                np.concatenate((old_envs, *envs)),
                np.concatenate((old_eps, *eps)),
                np.concatenate((old_steps, _per_step(steps, counts))),
            )
        return self._columns

    def keep(self, steps: np.ndarray) -> None:
        """Keep only the env steps ``steps`` (indices, in order); the rest are dropped."""
        self._columns = EnvSteps(*(c[steps] for c in self.columns()))
        self.size = len(steps)
        self.agent_steps = int(self._columns.agent_steps.sum())


def _per_step(steps: tuple[np.ndarray | int, ...], counts: list[int]) -> np.ndarray:
    """Agent steps per env step, from per-poll numbers or arrays."""
    if set(map(type, steps)) == {int}:
        return np.repeat(np.asarray(steps, dtype=np.int64), counts)
    parts = [np.full(n, s, np.int64) if type(s) is int else s for s, n in zip(steps, counts)]
    return np.concatenate(parts).astype(np.int64, copy=False)
