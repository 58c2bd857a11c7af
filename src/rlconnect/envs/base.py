"""The env contract the runner drives: poll rows, send actions, reset or restart sub-envs.

Every kind of env the runner accepts (gymnasium envs, vector envs, multi-agent envs,
PettingZoo, external simulators) is adapted to ``BaseEnv``. One round is::

    rows = env.poll()          # results of the last actions + first obs of fresh episodes
    ...                        # the runner processes rows, decides actions
    env.try_reset(env_id)      # for sub-envs whose episode ended in ``rows``
    env.send_actions(env_ids, agent_ids, actions)   # for rows that must act

Rows are columnar: row ``i`` is agent ``agent_ids[i]`` of sub-env ``env_ids[i]``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import tree

__all__ = ["BaseEnv", "EnvRows"]


class EnvRows:
    """What one ``poll()`` returns, column by column.

    - ``obs``: a stacked batch (``stacked=True``: array or nest of arrays with R rows, all
      rows share one space) or a list of R per-row observations (multi-agent).
    - ``rewards`` (float64), ``terminateds``, ``truncateds`` (bool), ``infos`` (list of dicts).
    - ``is_first``: the row is the first observation of a new episode (reward 0).
    - ``done_envs``: ``{env_id: (terminated, truncated)}`` for sub-envs whose whole episode
      ended at this poll (``__all__`` for multi-agent envs).
    - ``extra_rewards``: ``(env_id, agent_id, reward)`` for agents rewarded at this step
      without an observation; they count towards the agent's next transition.
    - ``errors``: ``{env_id: exception}`` for sub-envs whose step or reset raised (or that
      returned an observation that cannot be one of their space, ``EnvCheckError``); none
      of their rows are included.
    - ``stepped``: ids of sub-envs that took an env step at this poll (resets do not count).
    - ``dense``: every sub-env gave exactly one single-agent row, in env order, and none
      raised: the runner may then take its columnar fast path.
    """

    __slots__ = (
        "agent_ids",
        "dense",
        "done_envs",
        "env_ids",
        "errors",
        "extra_rewards",
        "infos",
        "is_first",
        "obs",
        "rewards",
        "stacked",
        "stepped",
        "terminateds",
        "truncateds",
    )

    def __init__(
        self,
        env_ids: np.ndarray,
        agent_ids: tuple,
        obs: Any,
        rewards: np.ndarray,
        terminateds: np.ndarray,
        truncateds: np.ndarray,
        infos: Sequence[dict],
        is_first: np.ndarray,
        *,
        stacked: bool,
        stepped: np.ndarray,
        done_envs: dict[int, tuple[bool, bool]] | None = None,
        extra_rewards: list[tuple[int, Any, float]] | None = None,
        errors: dict[int, BaseException] | None = None,
        dense: bool = False,
    ) -> None:
        self.dense = dense
        self.env_ids = env_ids
        self.agent_ids = agent_ids
        self.obs = obs
        self.rewards = rewards
        self.terminateds = terminateds
        self.truncateds = truncateds
        self.infos = infos
        self.is_first = is_first
        self.stacked = stacked
        self.stepped = stepped
        self.done_envs = done_envs or {}
        self.extra_rewards = extra_rewards or []
        self.errors = errors or {}

    def __len__(self) -> int:
        return len(self.env_ids)

    def without_envs(self, errors: Mapping[int, BaseException]) -> EnvRows:
        """These rows minus every row of the sub-envs in ``errors``, which are added to
        ``self.errors``: a sub-env that returned bad data is reported like one that raised."""
        ids = np.fromiter(errors, np.int64, len(errors))
        keep = np.flatnonzero(~np.isin(self.env_ids, ids))
        out = copy.copy(self)  # keeps the fields of subclasses (ExternalRows)
        out.env_ids = self.env_ids[keep]
        out.agent_ids = tuple(self.agent_ids[i] for i in keep.tolist())
        if self.stacked:
            out.obs = tree.map_structure(lambda x: np.asarray(x)[keep], self.obs)
        else:
            out.obs = [self.obs[i] for i in keep.tolist()]
        out.rewards = self.rewards[keep]
        out.terminateds = self.terminateds[keep]
        out.truncateds = self.truncateds[keep]
        out.infos = [self.infos[i] for i in keep.tolist()]
        out.is_first = self.is_first[keep]
        out.stepped = self.stepped[~np.isin(self.stepped, ids)]
        out.done_envs = {e: f for e, f in self.done_envs.items() if e not in errors}
        out.extra_rewards = [x for x in self.extra_rewards if x[0] not in errors]
        out.errors = {**self.errors, **errors}
        return out

    @classmethod
    def from_lists(
        cls,
        ids: list[int],
        agent_ids: tuple,
        obs: Any,
        rewards: list[float],
        terminateds: list[bool],
        truncateds: list[bool],
        infos: list[dict],
        first: list[bool],
        *,
        stacked: bool,
        stepped: list[int],
        done_envs: dict[int, tuple[bool, bool]] | None = None,
        extra_rewards: list[tuple[int, Any, float, bool, bool]] | None = None,
        errors: dict[int, BaseException] | None = None,
    ) -> EnvRows:
        """Columnar rows from the per-row lists an adapter collected while polling."""
        return cls(
            np.array(ids, dtype=np.int64),
            agent_ids,
            obs,
            np.array(rewards, dtype=np.float64),
            np.array(terminateds, dtype=bool),
            np.array(truncateds, dtype=bool),
            infos,
            np.array(first, dtype=bool),
            stacked=stacked,
            stepped=np.array(stepped, dtype=np.int64),
            done_envs=done_envs,
            extra_rewards=extra_rewards,
            errors=errors,
        )

    @classmethod
    def empty(cls, errors: dict[int, BaseException] | None = None) -> EnvRows:
        """No rows (e.g. every sub-env is waiting on an external simulator)."""
        z = np.zeros(0)
        return cls(
            np.zeros(0, np.int64),
            (),
            [],
            z,
            z.astype(bool),
            z.astype(bool),
            [],
            z.astype(bool),
            stacked=False,
            stepped=np.zeros(0, np.int64),
            errors=errors,
        )


class BaseEnv:
    """N sub-environments stepped together; the only env type the runner talks to.

    ``observation_space(agent_id)`` / ``action_space(agent_id)`` give each agent's spaces;
    single-agent envs use ``rc.DEFAULT_AGENT_ID``. ``possible_agents`` lists agent ids when
    known up front. A fresh BaseEnv has not been reset: the first ``poll()`` resets every
    sub-env (sub-env ``i`` seeded ``seed + i`` when a seed was given).
    """

    num_envs: int = 1
    is_multi_agent: bool = False
    possible_agents: tuple = ()
    #: whether ``poll()`` can return ``EnvRows.dense`` rows (the runner's fast path)
    polls_dense: bool = False

    def observation_space(self, agent_id: Any) -> gym.Space:
        """The observation space of ``agent_id``."""
        raise NotImplementedError

    def action_space(self, agent_id: Any) -> gym.Space:
        """The action space of ``agent_id``."""
        raise NotImplementedError

    def poll(self) -> EnvRows:
        """Step sub-envs that received actions, reset those asked to; return their rows."""
        raise NotImplementedError

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Queue actions (a stacked batch or a list, one row per ``(env_id, agent_id)``)."""
        raise NotImplementedError

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll (its episode ended)."""
        raise NotImplementedError

    def soft_reset(self, env_id: int) -> None:
        """Start a new episode in ``env_id`` without resetting it (the soft horizon).

        The next poll hands out the sub-env's last observations again as the first rows
        of the new episode; the env itself keeps running.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support soft resets")

    def try_restart(self, env_id: int) -> None:
        """Close and rebuild sub-env ``env_id`` (it raised); it resets at the next poll."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart sub-environments")

    def close(self) -> None:
        """Release every sub-env."""
