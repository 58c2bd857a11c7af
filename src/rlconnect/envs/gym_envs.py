"""Adapters for single-agent gymnasium envs: N copies stepped in a loop, or a VectorEnv."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.obs_stack import ObsStacker
from rlconnect.envs.rewards import reward_column
from rlconnect.envs.rows import EnvRowsBuilder
from rlconnect.envs.sub_envs import ContextRule, EnvContext, SubEnvs, sub_env_contexts
from rlconnect.spaces import unstack_batch

__all__ = ["DenseColumns", "GymEnvs"]


def _to_env_action(space: gym.Space, batch: Any) -> list:
    """Per-row actions as the envs expect them: numpy scalars or arrays (numpy integers pass
    gymnasium's ``Discrete.contains`` faster than Python ints)."""
    if isinstance(batch, np.ndarray):
        # (one row by index: iterating an array ends in an IndexError numpy formats)
        return [batch[0]] if len(batch) == 1 else list(batch)
    if isinstance(batch, list):
        return batch
    return unstack_batch(batch)


def _check_gym_env(env: Any) -> None:
    if not isinstance(env, gym.Env):
        raise TypeError(f"env creator returned {type(env).__name__}, not a gymnasium.Env")


class DenseColumns(NamedTuple):
    """A dense poll that went well, as columns (``GymEnvs.poll_columns``): row ``i`` is
    sub-env ``i``, observations stacked and rewards checked (float64); the rows of fresh
    episodes (``first``, None when there are none) already have reward 0 and no flags."""

    obs: Any
    rewards: np.ndarray
    terminateds: list[bool]
    truncateds: list[bool]
    infos: list[Mapping[str, Any]]
    first: np.ndarray | None


class GymEnvs(BaseEnv):
    """N single-agent gymnasium envs stepped one after another: the columnar fast path.

    ``creator(EnvContext) -> gym.Env`` builds sub-env ``i``; its first reset is seeded
    ``seed + i``. Exceptions in ``step``/``reset`` are caught per sub-env and reported in
    ``EnvRows.errors``; the runner decides whether to restart or raise. Building, seeding,
    resets and restarts are its ``SubEnvs``' (``rlconnect.envs.sub_envs``); this class
    turns what the sub-envs return into rows.
    """

    def __init__(
        self,
        creator: Callable[[EnvContext], gym.Env],
        num_envs: int,
        *,
        seed: int | None = None,
        worker_index: int = 0,
        env_config: dict[str, Any] | None = None,
        envs: list[gym.Env] | None = None,
        contexts: ContextRule | None = None,
    ) -> None:
        self.num_envs = num_envs
        rule = contexts or sub_env_contexts(num_envs, worker_index, seed, env_config)
        self._subs = SubEnvs(creator, num_envs, rule, envs=envs, check=_check_gym_env)
        first = self._subs.envs[0]
        self._obs_space = first.observation_space
        self._act_space = first.action_space
        self._agent_ids = (DEFAULT_AGENT_ID,) * num_envs
        self._id_list = list(range(num_envs))
        self._all_ids = np.arange(num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False  # shared by every poll's rows
        self.possible_agents = (DEFAULT_AGENT_ID,)
        self._stack = ObsStacker(self._obs_space)

    @property
    def envs(self) -> list[gym.Env]:
        """The sub-envs, in order (a restart replaces one in place)."""
        return self._subs.envs

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The sub-envs' shared observation space (checked equal when they were built)."""
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The sub-envs' shared action space (checked equal when they were built)."""
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Queue one action per ``env_id`` (converted to what the env's space takes)."""
        self._subs.actions.update(zip(env_ids.tolist(), _to_env_action(self._act_space, actions)))

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll."""
        self._subs.try_reset(env_id)

    def soft_reset(self, env_id: int) -> None:
        """Start a new episode in ``env_id`` at the next poll without resetting it."""
        self._subs.soft_reset(env_id)

    def try_restart(self, env_id: int) -> None:
        """Rebuild sub-env ``env_id`` (it raised); it resets at the next poll."""
        self._subs.try_restart(env_id)

    def poll(self) -> EnvRows:
        """Step or reset the sub-envs that need it and return their rows; a sub-env that
        raises comes back as an error row."""
        out = self.poll_columns()
        if not isinstance(out, DenseColumns):
            return out
        ids, agents = self._all_ids, self._agent_ids
        return EnvRowsBuilder.columns(ids, *out, agent_ids=agents, in_order=True)

    def poll_columns(self) -> DenseColumns | EnvRows:
        """``poll()``, except that a dense poll that went well (every sub-env stepped or
        reset, nothing raised, every observation and reward fits) comes as its columns:
        env workers copy them into shared memory as they are, without making ``EnvRows``."""
        subs = self._subs
        actions, resets, soft = subs.actions, subs.needs_reset, subs.soft
        if not soft and len(actions) + len(resets) == self.num_envs and resets.isdisjoint(actions):
            return self._poll_dense(actions, resets)
        rows = EnvRowsBuilder(single_agent=True)
        envs, last, agent = subs.envs, subs.last, DEFAULT_AGENT_ID
        for i in range(self.num_envs):
            try:
                if i in resets:
                    o, info = subs.reset(i)
                    rows.add_row(i, agent, o, info=info, first=True)
                elif i in soft:
                    o, info = last[i]
                    rows.add_row(i, agent, o, info=info, first=True)
                elif i in actions:
                    o, r, te, tr, info = envs[i].step(actions[i])
                    rows.add_row(i, agent, o, r, te, tr, info)
                else:
                    continue
            except Exception as exc:  # reported per sub-env, never lost
                rows.add_error(i, exc)
                continue
            resets.discard(i)
            last[i] = (o, info)
        soft.clear()
        actions.clear()
        return self._built(rows)

    def _built(self, rows: EnvRowsBuilder) -> EnvRows:
        out = rows.build(stack=self._stack)
        if out.errors:  # the causes ``try_restart`` names; failed resets are asked again
            self._subs.failures.update(out.errors)
            self._subs.needs_reset.difference_update(out.errors)
        return out

    def _poll_dense(self, actions: dict[int, Any], resets: set[int]) -> DenseColumns | EnvRows:
        """The common poll: every sub-env either steps with its action or resets."""
        obs: list[Any] = []
        rew: list[Any] = []
        term: list[bool] = []
        trunc: list[bool] = []
        infos: list[Mapping[str, Any]] = []
        reset_ok: list[int] = []
        errors: dict[int, BaseException] = {}
        subs = self._subs
        last = subs.last
        r: Any  # whatever the env returned: the builder checks it
        for i, env in enumerate(subs.envs):
            try:
                if i in resets:
                    o, info = subs.reset(i)
                    r, te, tr = 0.0, False, False
                    reset_ok.append(i)
                else:
                    o, r, te, tr, info = env.step(actions[i])
            except Exception as exc:  # reported per sub-env, never lost
                errors[i] = exc
                continue
            last[i] = (o, info)
            obs.append(o)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
            infos.append(info if info else EMPTY_INFO)
        actions.clear()
        resets.difference_update(reset_ok)
        if not errors:
            stacked, bad = self._stack(obs, self._id_list)
            rewards, bad_rewards = reward_column(rew, self._id_list, self._agent_ids)
            if not bad and not bad_rewards:
                first = None
                if reset_ok:
                    first = np.zeros(self.num_envs, dtype=bool)
                    first[reset_ok] = True
                dense = (stacked, rewards, term, trunc, infos, first)
                return tuple.__new__(DenseColumns, dense)  # (no namedtuple ``__new__`` call)
        # the general path names and drops the culprits
        return self._redo(obs, rew, term, trunc, infos, set(reset_ok), errors)

    def _redo(
        self,
        obs: list[Any],
        rew: list[Any],
        term: list[bool],
        trunc: list[bool],
        infos: list[Mapping[str, Any]],
        was_reset: set[int],
        errors: dict[int, BaseException],
    ) -> EnvRows:
        """The rows of a dense poll that went wrong somewhere, through the general builder."""
        rows = EnvRowsBuilder(single_agent=True)
        for i, exc in errors.items():
            rows.add_error(i, exc)
        ok = [i for i in range(self.num_envs) if i not in errors]
        for k, i in enumerate(ok):
            first = i in was_reset
            rows.add_row(
                i, DEFAULT_AGENT_ID, obs[k], rew[k], term[k], trunc[k], infos[k], first=first
            )
        return self._built(rows)

    def close(self) -> None:
        """Close every sub-env (an error closing one does not stop the others)."""
        self._subs.close()
