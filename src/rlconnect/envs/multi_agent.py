"""Multi-agent envs: the ``MultiAgentEnv`` base class users subclass, and its adapter."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.gym_envs import ContextRule, EnvContext, rebuild_error, sub_env_contexts
from rlconnect.envs.obs_stack import fits_dtype
from rlconnect.envs.rows import EnvRowsBuilder
from rlconnect.errors import EnvCheckError

__all__ = ["MultiAgentEnv", "MultiAgentEnvs"]


class MultiAgentEnv:
    """Base class of multi-agent envs, dict in and dict out.

    Subclasses set ``possible_agents`` and the dicts ``observation_spaces`` /
    ``action_spaces`` keyed by agent id, and implement ``reset(*, seed=None, options=None)
    -> (obs, infos)`` and ``step(actions) -> (obs, rewards, terminateds, truncateds, infos)``.
    ``obs`` holds the agents that act next (any subset, agents may join or leave);
    ``rewards`` may name agents without an observation (they are added to the agent's next
    transition); ``terminateds`` / ``truncateds`` carry ``"__all__"`` to end the episode.
    """

    possible_agents: list[Any] = []
    observation_spaces: dict[Any, gym.Space] = {}
    action_spaces: dict[Any, gym.Space] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode; returns observations and infos of the agents that act first."""
        raise NotImplementedError

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per acting agent."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources."""


def _episode_flags(flags: dict, key: str = "__all__") -> bool:
    return bool(flags.get(key, False))


def _add_step(
    rows: EnvRowsBuilder, i: int, o: dict, r: dict, te: dict, tr: dict, inf: Any, *, first: bool
) -> None:
    """Sub-env ``i``'s dicts as rows (agents with an observation) and extra rewards (agents
    rewarded or done without one)."""
    for a, ob in o.items():
        info = inf.get(a, {}) if isinstance(inf, dict) else {}
        if first:
            rows.add_row(i, a, ob, info=info, first=True)
        else:
            rows.add_row(i, a, ob, r.get(a, 0.0), te.get(a, False), tr.get(a, False), info)
    for a, val in r.items():
        if a not in o:
            rows.add_extra_reward(i, a, val, te.get(a, False), tr.get(a, False))
    for a in set(te) | set(tr):
        if a != "__all__" and a not in o and a not in r and (te.get(a) or tr.get(a)):
            rows.add_extra_reward(i, a, 0.0, te.get(a, False), tr.get(a, False))


class MultiAgentEnvs(BaseEnv):
    """N copies of an ``rc.MultiAgentEnv`` (or anything with its dict API) as one BaseEnv."""

    is_multi_agent = True

    def __init__(
        self,
        creator: Callable[[EnvContext], Any],
        num_envs: int,
        *,
        seed: int | None = None,
        worker_index: int = 0,
        env_config: dict[str, Any] | None = None,
        envs: list[Any] | None = None,
        contexts: ContextRule | None = None,
    ) -> None:
        self.num_envs = num_envs
        self._creator = creator
        self._contexts = contexts or sub_env_contexts(num_envs, worker_index, seed, env_config)
        self._restarts = [0] * num_envs
        self.envs = envs if envs is not None else [self._make(i) for i in range(num_envs)]
        first = self.envs[0]
        self.possible_agents = tuple(getattr(first, "possible_agents", ()))
        self._obs_spaces = dict(first.observation_spaces)
        self._act_spaces = dict(first.action_spaces)
        self._needs_reset = set(range(num_envs))
        self._seeded = [False] * num_envs
        self._actions: dict[int, dict] = {}
        self._idle: set[int] = set()  # stepped, no agent to act, not done: step with {}
        self._last: dict[int, tuple[dict, dict]] = {}
        self._failures: dict[int, BaseException] = {}  # what ``try_restart`` names
        self._soft: set[int] = set()

    def _context(self, index: int) -> EnvContext:
        """The context sub-env ``index`` is built with now; its first reset takes its seed."""
        return self._contexts(index, self._restarts[index])

    def _make(self, index: int) -> Any:
        return self._creator(self._context(index))

    def observation_space(self, agent_id: Any) -> gym.Space:
        try:
            return self._obs_spaces[agent_id]
        except KeyError:
            raise KeyError(
                f"agent {agent_id!r} has no observation space; known: {list(self._obs_spaces)}"
            ) from None

    def action_space(self, agent_id: Any) -> gym.Space:
        try:
            return self._act_spaces[agent_id]
        except KeyError:
            raise KeyError(
                f"agent {agent_id!r} has no action space; known: {list(self._act_spaces)}"
            ) from None

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        from rlconnect.spaces import unstack_batch

        rows = actions if isinstance(actions, list | np.ndarray) else unstack_batch(actions)
        for i, a, act in zip(env_ids.tolist(), agent_ids, rows):
            self._actions.setdefault(i, {})[a] = act

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        self._needs_reset.add(env_id)
        self._actions.pop(env_id, None)
        self._idle.discard(env_id)

    def soft_reset(self, env_id: int) -> None:
        self._soft.add(env_id)
        self._actions.pop(env_id, None)
        self._idle.discard(env_id)

    def try_restart(self, env_id: int) -> None:
        with contextlib.suppress(Exception):  # closing must not mask an earlier error
            self.envs[env_id].close()
        self._restarts[env_id] += 1
        failure = self._failures.pop(env_id, None)
        try:
            self.envs[env_id] = self._make(env_id)
        except Exception as exc:
            raise rebuild_error(env_id, failure, exc) from (failure or exc)
        self._seeded[env_id] = False
        self.try_reset(env_id)

    def poll(self) -> EnvRows:
        rows = EnvRowsBuilder()
        for i in range(self.num_envs):
            resetting = i in self._needs_reset or i in self._soft
            if not resetting and i not in self._actions and i not in self._idle:
                continue
            try:
                o, r, te, tr, inf = self._advance(i, resetting)
            except Exception as exc:  # reported per sub-env, never lost
                rows.add_error(i, exc)
                self._actions.pop(i, None)
                continue
            self._needs_reset.discard(i)
            self._soft.discard(i)
            self._idle.discard(i)
            bad = self._malformed(i, o)
            if bad is not None:  # reported like a raise: restarted, or named in the error
                rows.add_error(i, bad)
                continue
            if o:
                self._last[i] = (o, inf)
            if not resetting:
                rows.mark_stepped(i)
            _add_step(rows, i, o, r, te, tr, inf, first=resetting)
            all_te, all_tr = _episode_flags(te), _episode_flags(tr)
            if all_te or all_tr:
                rows.end_episode(i, all_te, all_tr)
            elif not o:
                self._idle.add(i)
        out = rows.build()
        self._failures.update(out.errors)
        return out

    def _advance(self, i: int, resetting: bool) -> tuple[dict, dict, dict, dict, dict]:
        """Sub-env ``i``'s soft reset, reset or step: ``(obs, rewards, terminateds,
        truncateds, infos)`` dicts (empty rewards and flags for a reset)."""
        if i in self._soft and i not in self._needs_reset:
            o, inf = self._last[i]
            return o, {}, {}, {}, inf
        if resetting:
            seed = None
            if not self._seeded[i]:
                seed = self._context(i).seed
                self._seeded[i] = True
            o, inf = self.envs[i].reset(seed=seed)
            return o, {}, {}, {}, inf
        return self.envs[i].step(self._actions.pop(i, {}))

    def _malformed(self, env_id: int, obs: dict) -> EnvCheckError | None:
        """An error naming the agents whose Box observation has a wrong shape or dtype kind
        (these could not be stacked, or would be cast silently), else None."""
        problems = []
        for a, ob in obs.items():
            space = self._obs_spaces.get(a)
            if type(space) is not gym.spaces.Box:
                continue
            arr = ob if isinstance(ob, np.ndarray) else np.asarray(ob)
            if arr.shape != space.shape:
                problems.append(f"env {env_id} / agent {a!r}: wrong shape {arr.shape}")
            elif not fits_dtype(arr, space.dtype):
                problems.append(f"env {env_id} / agent {a!r}: wrong dtype {arr.dtype}")
        if not problems:
            return None
        return EnvCheckError("env returned a bad observation: " + "; ".join(problems))

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):  # closing must not mask an earlier error
                env.close()
