"""``EnvStepLog``: one event per env step (poll, sub-env, episode, agent steps), the
measure by which batches are sized and cut.

A poll adds its steps as one tuple of whole arrays (O(1)); the columns are built when they
are read, or every ``MERGE_EVERY`` polls so that memory grows with steps, not polls.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, NamedTuple

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
        #: each poll's steps: four numbers when one sub-env stepped, else arrays
        self._pending: list[tuple[Any, ...]] = []
        self._singles = 0  # pending polls that stepped one sub-env

    def add(
        self, poll: int, env_ids: np.ndarray, eps_ids: np.ndarray, agent_steps: np.ndarray | int
    ) -> None:
        """Sub-envs ``env_ids`` (in episodes ``eps_ids``) stepped at ``poll``; ``agent_steps``:
        the transitions each completed, or one number for all."""
        n = len(env_ids)
        if not n:
            return
        self.size += n
        if n == 1:  # (one sub-env, as in a runner of one or a turn-based poll: numbers)
            steps = agent_steps if isinstance(agent_steps, int) else agent_steps.tolist()[0]
            self.agent_steps += steps
            self._pending.append((poll, *env_ids.tolist(), *eps_ids.tolist(), steps))
            self._singles += 1
        else:
            if type(agent_steps) is int:  # (not isinstance: no call, every poll)
                self.agent_steps += n * agent_steps
            elif n <= _PYTHON_SUM_MAX and isinstance(agent_steps, np.ndarray):
                # a few numbers: Python's sum costs less than a ufunc
                self.agent_steps += sum(agent_steps.tolist())
            else:
                self.agent_steps += int(np.add.reduce(agent_steps))  # (no wrapper: every poll)
            self._pending.append((poll, env_ids, eps_ids, agent_steps))
        if len(self._pending) >= MERGE_EVERY:
            self.columns()

    def columns(self) -> EnvSteps:
        """Every logged env step."""
        if self._pending:
            new = self._merge_pending()
            self._columns = EnvSteps(*map(np.concatenate, zip(self._columns, new)))
        return self._columns

    def _merge_pending(self) -> EnvSteps:
        """The pending polls' steps as columns (polls of one sub-env each: their numbers
        read in one call)."""
        pending, singles = self._pending, self._singles
        self._pending, self._singles = [], 0
        if singles == len(pending):
            flat = np.fromiter(chain.from_iterable(pending), np.int64, 4 * len(pending))
            return EnvSteps(*flat.reshape(-1, 4).T)
        if singles:  # numbers as arrays of one step
            pending = [
                p if type(p[1]) is np.ndarray else (p[0], *map(_one, p[1:])) for p in pending
            ]
        polls, envs, eps, steps = zip(*pending)
        counts = list(map(len, envs))
        return EnvSteps(
            np.repeat(np.asarray(polls, np.int64), counts),
            np.concatenate(envs),
            np.concatenate(eps),
            _per_step(steps, counts),
        )

    def keep(self, steps: np.ndarray) -> None:
        """Keep only the env steps ``steps`` (indices, in order); the rest are dropped."""
        self._columns = EnvSteps(*(c[steps] for c in self.columns()))
        self.size = len(steps)
        self.agent_steps = int(self._columns.agent_steps.sum())


def _one(number: int) -> np.ndarray:
    return np.full(1, number, np.int64)


def _per_step(steps: tuple[np.ndarray | int, ...], counts: list[int]) -> np.ndarray:
    """Agent steps per env step, from per-poll numbers or arrays."""
    if set(map(type, steps)) == {int}:
        return np.repeat(np.asarray(steps, dtype=np.int64), counts)
    parts = [np.full(n, s, np.int64) if type(s) is int else s for s, n in zip(steps, counts)]
    return np.concatenate(parts).astype(np.int64, copy=False)
