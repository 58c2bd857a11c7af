"""Adapters for single-agent gymnasium envs: N copies stepped in a loop, or a VectorEnv."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.errors import EnvCheckError, EnvError
from rlconnect.spaces import stack_samples

__all__ = ["EnvContext", "GymEnvs", "VectorEnvAdapter", "sub_env_seed"]


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


def _to_env_action(space: gym.Space, batch: Any) -> list:
    """Per-row actions in the form envs like best (Python ints for Discrete: fast contains)."""
    if isinstance(space, gym.spaces.Discrete) and isinstance(batch, np.ndarray):
        return batch.tolist()
    if isinstance(batch, np.ndarray):
        return list(batch)
    if isinstance(batch, list):
        return batch
    from rlconnect.spaces import unstack_batch

    return unstack_batch(batch)


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
    ) -> None:
        self.num_envs = num_envs
        self._creator = creator
        self._seed = seed
        self._worker_index = worker_index
        self._env_config = dict(env_config or {})
        self._restarts = [0] * num_envs
        self.envs: list[gym.Env] = (
            envs if envs is not None else [self._make(i) for i in range(num_envs)]
        )
        self._obs_space = self.envs[0].observation_space
        self._act_space = self.envs[0].action_space
        self._agent_ids = (DEFAULT_AGENT_ID,) * num_envs
        self.possible_agents = (DEFAULT_AGENT_ID,)
        self._needs_reset = set(range(num_envs))
        self._seeded = [False] * num_envs
        self._actions: dict[int, Any] = {}
        self._last: dict[int, tuple[Any, dict]] = {}
        self._soft: set[int] = set()
        self._failures: dict[int, BaseException] = {}
        box = isinstance(self._obs_space, gym.spaces.Box)
        self._obs_shape = self._obs_space.shape if box else None
        self._obs_dtype = self._obs_space.dtype if box else None

    def _make(self, index: int) -> gym.Env:
        ctx = EnvContext(
            vector_index=index,
            num_envs=self.num_envs,
            worker_index=self._worker_index,
            seed=sub_env_seed(self._seed, index, self._restarts[index]),
            config=self._env_config,
        )
        env = self._creator(ctx)
        if not isinstance(env, gym.Env):
            raise TypeError(f"env creator returned {type(env).__name__}, not a gymnasium.Env")
        return env

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        for i, a in zip(env_ids.tolist(), _to_env_action(self._act_space, actions)):
            self._actions[i] = a

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
            what = f" after it raised {type(failure).__name__}: {failure}" if failure else ""
            raise EnvError(f"sub-env {env_id} could not be rebuilt{what}; {exc}") from (
                failure or exc
            )
        self._seeded[env_id] = False
        self.try_reset(env_id)

    def _reset_one(self, i: int) -> tuple[Any, dict]:
        seed = None
        if not self._seeded[i]:
            seed = sub_env_seed(self._seed, i, self._restarts[i])
            self._seeded[i] = True
        return self.envs[i].reset(seed=seed)

    def poll(self) -> EnvRows:
        ids: list[int] = []
        obs: list[Any] = []
        rew: list[float] = []
        term: list[bool] = []
        trunc: list[bool] = []
        infos: list[dict] = []
        first: list[bool] = []
        stepped: list[int] = []
        errors: dict[int, BaseException] = {}
        envs, actions, resets, soft = self.envs, self._actions, self._needs_reset, self._soft
        for i in range(self.num_envs):
            try:
                if i in resets:
                    o, info = self._reset_one(i)
                    r, te, tr, f = 0.0, False, False, True
                elif i in soft:
                    o, info = self._last[i]
                    r, te, tr, f = 0.0, False, False, True
                elif i in actions:
                    o, r, te, tr, info = envs[i].step(actions[i])
                    f = False
                else:
                    continue
            except Exception as exc:  # reported per sub-env, never lost
                errors[i] = self._failures[i] = exc
                continue
            if not f:
                stepped.append(i)
            ids.append(i)
            self._last[i] = (o, info)
            obs.append(o)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
            infos.append(info)
            first.append(f)
        resets.difference_update(ids)
        resets.difference_update(errors)
        soft.clear()
        actions.clear()
        terminateds = np.array(term, dtype=bool)
        truncateds = np.array(trunc, dtype=bool)
        done = terminateds | truncateds
        env_ids = np.array(ids, dtype=np.int64)
        done_envs = {}
        if done.any():
            for k in np.flatnonzero(done).tolist():
                done_envs[ids[k]] = (bool(terminateds[k]), bool(truncateds[k]))
        return EnvRows(
            env_ids,
            self._agent_ids[: len(ids)],
            self._stack(obs, ids),
            np.array(rew, dtype=np.float64),
            terminateds,
            truncateds,
            infos,
            np.array(first, dtype=bool),
            stacked=True,
            stepped=np.array(stepped, dtype=np.int64),
            done_envs=done_envs,
            errors=errors,
        )

    def _stack(self, obs: list[Any], ids: list[int]) -> Any:
        """One array for Box spaces, cast to the space's dtype within the same kind.

        A wrong shape or dtype kind is left as it is, so ``check_env`` can name it; rows
        that cannot be stacked at all raise ``EnvCheckError`` naming the sub-envs.
        """
        if self._obs_shape is None:
            return stack_samples(self._obs_space, obs)
        shape, dtype = self._obs_shape, self._obs_dtype
        if not obs:
            return np.empty((0, *shape), dtype=dtype)
        try:
            arr = np.array(obs)  # the fastest stack of N equal arrays, and it keeps dtypes
        except (ValueError, TypeError) as exc:
            bad = [i for i, o in zip(ids, obs) if np.shape(o) != shape] or ids
            where = ", ".join(f"env {i} / agent {DEFAULT_AGENT_ID!r}" for i in bad[:5])
            got = ", ".join(str(np.shape(obs[ids.index(i)])) for i in bad[:5])
            raise EnvCheckError(
                f"env returned a bad observation: obs of {where} has shape {got}, "
                f"expected {shape} ({exc})"
            ) from None
        if arr.dtype != dtype and arr.shape[1:] == shape:
            if np.can_cast(arr.dtype, dtype, "same_kind"):
                arr = arr.astype(dtype)
        return arr

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):  # closing must not mask an earlier error
                env.close()


class VectorEnvAdapter(BaseEnv):
    """A ``gymnasium.vector.VectorEnv`` of any autoreset mode, never recording reset steps.

    DISABLED mode resets finished sub-envs with a reset mask. NEXT_STEP mode feeds a
    placeholder action to a finished sub-env and reports the step that only resets as the
    first row of the new episode (not an env step). SAME_STEP mode keeps the reset
    observation that came with the final one and hands it out at the next poll before
    the vector steps again (costing one extra runner round per finished episode).
    """

    def __init__(self, venv: gym.vector.VectorEnv, *, seed: int | None = None) -> None:
        self.venv = venv
        self.num_envs = venv.num_envs
        self._seed = seed
        self._obs_space = venv.single_observation_space
        self._act_space = venv.single_action_space
        mode = venv.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self._mode = gym.vector.AutoresetMode(mode)
        self.possible_agents = (DEFAULT_AGENT_ID,)
        self._started = False
        self._pending_reset: set[int] = set()
        self._stash: dict[int, tuple[Any, dict]] = {}
        self._actions: dict[int, Any] = {}

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        from rlconnect.spaces import unstack_batch

        rows = actions if isinstance(actions, np.ndarray) else unstack_batch(actions)
        for i, a in zip(env_ids.tolist(), rows):
            self._actions[i] = a

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        self._pending_reset.add(env_id)

    def _rows(self, ids: list[int], obs: list, rew, term, trunc, infos, first, stepped) -> EnvRows:
        terminateds = np.asarray(term, dtype=bool)
        truncateds = np.asarray(trunc, dtype=bool)
        done_envs = {
            i: (bool(a), bool(b)) for i, a, b in zip(ids, terminateds, truncateds) if a or b
        }
        return EnvRows(
            np.asarray(ids, dtype=np.int64),
            (DEFAULT_AGENT_ID,) * len(ids),
            stack_samples(self._obs_space, obs),
            np.asarray(rew, dtype=np.float64),
            terminateds,
            truncateds,
            infos,
            np.asarray(first, dtype=bool),
            stacked=True,
            stepped=np.asarray(stepped, dtype=np.int64),
            done_envs=done_envs,
        )

    def poll(self) -> EnvRows:
        n = self.num_envs
        if not self._started:
            self._started = True
            obs, info = self.venv.reset(seed=self._seed)
            self._pending_reset.clear()
            return self._rows(
                list(range(n)),
                list(obs),
                [0.0] * n,
                [False] * n,
                [False] * n,
                _split_infos(info, n),
                [True] * n,
                [],
            )
        if self._mode is gym.vector.AutoresetMode.SAME_STEP and self._stash:
            ids = sorted(self._stash)
            rows = [self._stash.pop(i) for i in ids]
            self._pending_reset.difference_update(ids)
            return self._rows(
                ids,
                [o for o, _ in rows],
                [0.0] * len(ids),
                [False] * len(ids),
                [False] * len(ids),
                [inf for _, inf in rows],
                [True] * len(ids),
                [],
            )
        if self._mode is gym.vector.AutoresetMode.DISABLED and self._pending_reset:
            mask = np.zeros(n, dtype=bool)
            mask[list(self._pending_reset)] = True
            obs, info = self.venv.reset(options={"reset_mask": mask})
            ids = sorted(self._pending_reset)
            self._pending_reset.clear()
            infos = _split_infos(info, n)
            return self._rows(
                ids,
                [obs[i] for i in ids],
                [0.0] * len(ids),
                [False] * len(ids),
                [False] * len(ids),
                [infos[i] for i in ids],
                [True] * len(ids),
                [],
            )
        placeholder = self._act_space.sample()
        acts = [self._actions.pop(i, placeholder) for i in range(n)]
        obs, rew, term, trunc, info = self.venv.step(np.stack(acts))
        infos = _split_infos(info, n)
        resetting = self._pending_reset
        self._pending_reset = set()
        first = [i in resetting for i in range(n)]
        stepped = [i for i in range(n) if not first[i]]
        obs_rows = list(obs)
        if self._mode is gym.vector.AutoresetMode.SAME_STEP:
            done = np.asarray(term) | np.asarray(trunc)
            for i in np.flatnonzero(done).tolist():
                self._stash[i] = (obs[i], infos[i])
                obs_rows[i] = info["final_obs"][i]
                infos[i] = info.get("final_info", {}) and _split_infos(info["final_info"], n)[i]
        rew = [0.0 if first[i] else float(rew[i]) for i in range(n)]
        term = [False if first[i] else bool(term[i]) for i in range(n)]
        trunc = [False if first[i] else bool(trunc[i]) for i in range(n)]
        return self._rows(list(range(n)), obs_rows, rew, term, trunc, infos, first, stepped)

    def close(self) -> None:
        self.venv.close()


def _split_infos(info: dict, n: int) -> list[dict]:
    """Gymnasium's vector info (dict of arrays with ``_key`` masks) -> one dict per sub-env."""
    out: list[dict] = [{} for _ in range(n)]
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        for i in range(n):
            if mask is None or mask[i]:
                out[i][key] = value[i] if not isinstance(value, dict) else _split_infos(value, n)[i]
    return out
