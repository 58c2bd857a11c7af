"""Trajectory ids: one per agent per episode, and who each one belongs to.

Every row a collector stores carries the id of its agent trajectory (``_traj``); batches
are built by grouping rows on it. This registry hands out the ids, remembers the agent and
episode of each (what ``postprocess_trajectory`` and offline output need), and forgets them
once a closed trajectory has been handed out whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.episodes import Episode
from rlconnect.runner.leftovers import Leftovers

__all__ = ["TrajectoryIds"]


class TrajectoryIds:
    """Issues trajectory ids; ``owner(t)`` gives ``(agent_id, episode)`` of a live one.

    Single-agent envs have one trajectory per sub-env episode, kept in ``of_env`` (an
    array, so the fast path reads every sub-env's id at once; -1: none open).
    """

    def __init__(self, num_envs: int, leftovers: Leftovers | None = None) -> None:
        self.of_env = np.full(num_envs, -1, dtype=np.int64)
        #: where forgotten owners go (their episodes are freed a few per poll); None: at once
        self._leftovers = leftovers
        self._owners: dict[int, tuple[Any, Episode]] = {}
        self._closed: list[int] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._owners)

    def new(self, agent_id: Any, episode: Episode) -> int:
        """A fresh id for ``agent_id``'s trajectory in ``episode``."""
        t = self._next
        self._next += 1
        self._owners[t] = (agent_id, episode)
        return t

    def open_single(self, env_ids: list[int]) -> range:
        """Single-agent: a new trajectory in each of ``env_ids`` (their episodes began);
        ``own`` says whose they are."""
        ids = range(self._next, self._next + len(env_ids))
        self._next += len(env_ids)
        self.of_env[env_ids] = np.arange(ids.start, ids.stop)
        return ids

    def own(self, traj_ids: range, agent_id: Any, episodes: list[Episode]) -> None:
        """Trajectories ``traj_ids`` (from ``open_single``) are ``agent_id``'s in ``episodes``."""
        self._owners.update(zip(traj_ids, [(agent_id, ep) for ep in episodes], strict=True))

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
        return self._owners.get(traj_id, (None, None))

    def forget_handed_out(self, collectors: PolicyCollectorGroup) -> None:
        """Drop the owners of closed trajectories that have no row left in ``collectors``
        (into the leftovers, if any: their episodes are then freed later)."""
        if not self._closed:
            return
        left = [c.trajectory_ids() for c in collectors.collectors.values() if len(c)]
        still = set(np.concatenate(left).tolist()) if left else set()
        keep, dropped = [], []
        owners = self._owners
        for t in self._closed:
            if t in still:
                keep.append(t)
            elif t in owners:
                dropped.append(owners.pop(t))
        self._closed = keep
        if self._leftovers is not None:
            self._leftovers.put(dropped)
