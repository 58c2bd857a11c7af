"""Adapters for single-agent gymnasium envs: N copies stepped in a loop, or a VectorEnv."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import attrs
import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.obs_stack import ObsStacker
from rlconnect.envs.rewards import reward_column
from rlconnect.envs.rows import EnvRowsBuilder
from rlconnect.errors import EnvError, describe_exception
from rlconnect.spaces import unstack_batch

__all__ = [
    "ContextRule",
    "DenseColumns",
    "EnvContext",
    "GymEnvs",
    "rebuild_error",
    "sub_env_context",
    "sub_env_contexts",
    "sub_env_seed",
]


@attrs.define(frozen=True)
class EnvContext:
    """Passed to env creators: which sub-env is being built and with what seed."""

    vector_index: int = 0
    num_envs: int = 1
    worker_index: int = 0
    seed: int | None = None
    config: dict[str, Any] = attrs.field(factory=dict)


def sub_env_seed(seed: int | None, index: int, restarts: int = 0) -> int | None:
    """Seed of sub-env ``index``: ``seed + index``; a restarted env gets a fresh derived seed."""
    if seed is None:
        return None
    if restarts == 0:
        return seed + index
    return int(np.random.SeedSequence([seed, index, restarts]).generate_state(1)[0])


def rebuild_error(env_id: int, failure: BaseException | None, exc: BaseException) -> EnvError:
    """Sub-env ``env_id`` failed with ``failure`` (None: not known) and building it anew
    raised ``exc``: the error names both (raise it from ``failure or exc``)."""
    what = f" after it raised {describe_exception(failure)}" if failure is not None else ""
    told = describe_exception(exc).removeprefix(f"{type(exc).__name__}: ")  # its message
    return EnvError(f"sub-env {env_id} could not be rebuilt{what}; {told}")


def sub_env_context(
    index: int,
    num_envs: int,
    worker_index: int,
    seed: int | None,
    restarts: int,
    config: dict[str, Any],
) -> EnvContext:
    """The context sub-env ``index`` is built with after ``restarts`` rebuilds (its first
    reset takes ``ctx.seed``): one rule for every adapter, in the runner or a worker."""
    return EnvContext(
        vector_index=index,
        num_envs=num_envs,
        worker_index=worker_index,
        seed=sub_env_seed(seed, index, restarts),
        config=config,
    )


ContextRule = Callable[[int, int], EnvContext]
"""``(index, restarts) -> EnvContext``: how an adapter builds (and first seeds) sub-env
``index`` after ``restarts`` rebuilds."""


def sub_env_contexts(
    num_envs: int, worker_index: int, seed: int | None, config: dict[str, Any] | None
) -> ContextRule:
    """The ``ContextRule`` of ``num_envs`` sub-envs in the runner's process; env workers
    give their adapters ``GroupSpec.local_context`` instead (global indices)."""
    config = dict(config or {})

    def context(index: int, restarts: int) -> EnvContext:
        return sub_env_context(index, num_envs, worker_index, seed, restarts, config)

    return context


def _to_env_action(space: gym.Space, batch: Any) -> list:
    """Per-row actions as the envs expect them: numpy scalars or arrays (numpy integers pass
    gymnasium's ``Discrete.contains`` faster than Python ints)."""
    if isinstance(batch, np.ndarray):
        return list(batch)
    if isinstance(batch, list):
        return batch
    return unstack_batch(batch)


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
    ``EnvRows.errors``; the runner decides whether to restart or raise.
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
        self._creator = creator
        self._contexts = contexts or sub_env_contexts(num_envs, worker_index, seed, env_config)
        self._restarts = [0] * num_envs
        self.envs: list[gym.Env] = (
            envs if envs is not None else [self._make(i) for i in range(num_envs)]
        )
        self._obs_space = self.envs[0].observation_space
        self._act_space = self.envs[0].action_space
        self._agent_ids = (DEFAULT_AGENT_ID,) * num_envs
        self._id_list = list(range(num_envs))
        self._all_ids = np.arange(num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False  # shared by every poll's rows
        self.possible_agents = (DEFAULT_AGENT_ID,)
        self._needs_reset = set(range(num_envs))
        self._seeded = [False] * num_envs
        self._actions: dict[int, Any] = {}
        self._last: dict[int, tuple[Any, dict]] = {}
        self._soft: set[int] = set()
        self._failures: dict[int, BaseException] = {}
        self._stack = ObsStacker(self._obs_space)

    def _context(self, index: int) -> EnvContext:
        """The context sub-env ``index`` is built with now; its first reset takes its seed."""
        return self._contexts(index, self._restarts[index])

    def _make(self, index: int) -> gym.Env:
        env = self._creator(self._context(index))
        if not isinstance(env, gym.Env):
            raise TypeError(f"env creator returned {type(env).__name__}, not a gymnasium.Env")
        return env

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        self._actions.update(zip(env_ids.tolist(), _to_env_action(self._act_space, actions)))

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        self._needs_reset.add(env_id)
        self._actions.pop(env_id, None)

    def soft_reset(self, env_id: int) -> None:
        self._soft.add(env_id)
        self._actions.pop(env_id, None)

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

    def _reset_one(self, i: int) -> tuple[Any, dict]:
        seed = None
        if not self._seeded[i]:
            seed = self._context(i).seed
            self._seeded[i] = True
        return self.envs[i].reset(seed=seed)

    def poll(self) -> EnvRows:
        out = self.poll_columns()
        if not isinstance(out, DenseColumns):
            return out
        ids, agents = self._all_ids, self._agent_ids
        return EnvRowsBuilder.columns(ids, *out, agent_ids=agents, in_order=True)

    def poll_columns(self) -> DenseColumns | EnvRows:
        """``poll()``, except that a dense poll that went well (every sub-env stepped or
        reset, nothing raised, every observation and reward fits) comes as its columns:
        env workers copy them into shared memory as they are, without making ``EnvRows``."""
        actions, resets, soft = self._actions, self._needs_reset, self._soft
        if not soft and len(actions) + len(resets) == self.num_envs and resets.isdisjoint(actions):
            return self._poll_dense(actions, resets)
        rows = EnvRowsBuilder(single_agent=True)
        envs, agent = self.envs, DEFAULT_AGENT_ID
        for i in range(self.num_envs):
            try:
                if i in resets:
                    o, info = self._reset_one(i)
                    rows.add_row(i, agent, o, info=info, first=True)
                elif i in soft:
                    o, info = self._last[i]
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
            self._last[i] = (o, info)
        soft.clear()
        actions.clear()
        return self._built(rows)

    def _built(self, rows: EnvRowsBuilder) -> EnvRows:
        out = rows.build(stack=self._stack)
        if out.errors:  # the causes ``try_restart`` names; failed resets are asked again
            self._failures.update(out.errors)
            self._needs_reset.difference_update(out.errors)
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
        last = self._last
        r: Any  # whatever the env returned: the builder checks it
        for i, env in enumerate(self.envs):
            try:
                if i in resets:
                    o, info = self._reset_one(i)
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
                return DenseColumns(stacked, rewards, term, trunc, infos, first)
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
        for env in self.envs:
            with contextlib.suppress(Exception):  # closing must not mask an earlier error
                env.close()
