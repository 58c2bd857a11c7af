"""``TrajectoryIds``: the id of every agent trajectory (the key its rows carry in the
collectors), who it belongs to, and when it may be forgotten."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from rlconnect.episodes.episode import Episode

__all__ = ["TrajectoryIds"]


class TrajectoryIds:
    """Issues trajectory ids; ``owner(t)`` gives ``(agent_id, episode)`` of a live one.

    Single-agent envs have one trajectory per sub-env episode, kept in ``of_env`` (an
    array, so the fast path reads every sub-env's id at once; -1: none open).
    """

    def __init__(self, num_envs: int) -> None:
        self.of_env = np.full(num_envs, -1, dtype=np.int64)
        #: each live trajectory's episode and agent (two dicts, not a tuple per trajectory:
        #: fewer objects for the garbage collector to follow while the rows wait)
        self._episodes: dict[int, Episode] = {}
        self._agents: dict[int, Any] = {}
        self._closed: list[int] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def new(self, agent_id: Any, episode: Episode) -> int:
        """A fresh id for ``agent_id``'s trajectory in ``episode``."""
        t = self._next
        self._next += 1
        self._episodes[t] = episode
        self._agents[t] = agent_id
        return t

    def open_single(self, env_ids: list[int], agent_id: Any, episodes: list[Episode]) -> None:
        """Single-agent: a new trajectory of ``agent_id`` in each of ``env_ids``, whose
        ``episodes`` began."""
        ids = range(self._next, self._next + len(env_ids))
        self._next += len(env_ids)
        self.of_env[env_ids] = np.arange(ids.start, ids.stop)
        self._episodes.update(zip(ids, episodes, strict=True))
        self._agents.update(dict.fromkeys(ids, agent_id))

    def close(self, traj_id: int) -> None:
        """The trajectory ended: forget it once its rows have all been handed out."""
        self._closed.append(traj_id)

    def close_single(self, env_ids: list[int]) -> None:
        """Single-agent: the trajectories of sub-envs ``env_ids`` ended."""
        of_env, closed = self.of_env, self._closed
        for e in env_ids:
            t = int(of_env[e])
            if t >= 0:
                closed.append(t)
                of_env[e] = -1

    def owner(self, traj_id: int) -> tuple[Any, Episode | None]:
        """``(agent_id, episode)`` of a trajectory (``(None, None)`` when forgotten)."""
        return self._agents.get(traj_id), self._episodes.get(traj_id)

    def forget_handed_out(self, held: Callable[[], Collection[int]]) -> None:
        """Drop the owners of closed trajectories that have no row left (``held()``: the
        trajectory ids the collectors hold rows of, asked only when some closed)."""
        if not self._closed:
            return
        still = held()
        keep = []
        episodes, agents = self._episodes, self._agents
        for t in self._closed:
            if t in still:
                keep.append(t)
            else:
                episodes.pop(t, None)
                agents.pop(t, None)
        self._closed = keep
