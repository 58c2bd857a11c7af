"""A ``gymnasium.vector.VectorEnv`` as a BaseEnv, in any of its autoreset modes."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.rows import EnvRowsBuilder
from rlconnect.spaces import stack_samples, unstack_batch

__all__ = ["VectorEnvAdapter"]


class VectorEnvAdapter(BaseEnv):
    """A ``gymnasium.vector.VectorEnv`` of any autoreset mode, never recording reset steps.

    A vector step moves every sub-env at once, while the first action of a fresh episode
    is only known one poll after its reset observation. So:

    - NEXT_STEP: a finished sub-env gets a placeholder action (a fixed valid action, no
      RNG drawn) and the step that only resets it is reported as the first row of its
      new episode, not as an env step. Rows come exactly as from N plain envs.
    - SAME_STEP: the final observation is taken from ``info["final_obs"]`` and the reset
      observation that came with it is handed out at the next poll, before the vector
      steps again (one extra round per poll with finished episodes).
    - DISABLED: finished sub-envs are reset with a ``reset_mask`` in a round of their own.

    In every mode, a sub-env whose episode the runner ends although the vector env did not
    (``horizon``) is reset with a ``reset_mask`` in such a round of its own. A vector env
    cannot rebuild one sub-env, so ``try_restart`` raises (``BaseEnv``'s default).
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
        self._done = np.zeros(self.num_envs, dtype=bool)  # finished at the last vector step
        space = copy.deepcopy(self._act_space)  # the env's own space (and RNG) stays untouched
        space.seed(0)
        self._placeholder = space.sample()

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The vector env's single (per sub-env) observation space."""
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The vector env's single (per sub-env) action space."""
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Keep one action per ``env_id`` for the next poll, which steps the vector env."""
        rows = actions if isinstance(actions, np.ndarray) else unstack_batch(actions)
        for i, a in zip(env_ids.tolist(), rows):
            self._actions[i] = a

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll (its queued action is dropped)."""
        self._pending_reset.add(env_id)
        self._actions.pop(env_id, None)

    def _rows(
        self,
        ids: list[int],
        obs: Any,
        rew: Any,
        term: Any,
        trunc: Any,
        infos: list[dict],
        first: Any,
    ) -> EnvRows:
        batch = obs if not isinstance(obs, list) else stack_samples(self._obs_space, obs)
        env_ids = np.asarray(ids, dtype=np.int64)
        first = np.asarray(first, dtype=bool)
        shared: list[Mapping[str, Any]] = [i if i else EMPTY_INFO for i in infos]
        return EnvRowsBuilder.columns(env_ids, batch, rew, term, trunc, shared, first)

    def _first_rows(self, ids: list[int], obs: Any, infos: list[dict]) -> EnvRows:
        k = len(ids)
        return self._rows(
            ids, obs, np.zeros(k), np.zeros(k, bool), np.zeros(k, bool), infos, np.ones(k, bool)
        )

    def poll(self) -> EnvRows:
        """Step the vector env (reset it at the first poll) and return the rows, hiding the
        reset steps that the autoreset mode inserts."""
        n = self.num_envs
        if not self._started:
            self._started = True
            obs, info = self.venv.reset(seed=self._seed)
            self._pending_reset.clear()
            self._done[:] = False
            return self._first_rows(list(range(n)), obs, _split_infos(info, n))
        same_step = self._mode is gym.vector.AutoresetMode.SAME_STEP
        pending = self._pending_reset
        if self._mode is gym.vector.AutoresetMode.NEXT_STEP:
            masked = sorted(i for i in pending if not self._done[i])  # the venv won't reset these
        elif same_step:
            masked = sorted(i for i in pending if i not in self._stash)
        else:
            masked = sorted(pending)
        if masked or (same_step and self._stash):
            return self._reset_round(masked, same_step)
        return self._step_round(same_step)

    def _reset_round(self, masked: list[int], same_step: bool) -> EnvRows:
        """First rows only: of the sub-envs reset with a ``reset_mask`` now, and (SAME_STEP)
        those whose reset came with the last step."""
        firsts: dict[int, tuple[Any, dict]] = {}
        if masked:
            n = self.num_envs
            mask = np.zeros(n, dtype=bool)
            mask[masked] = True
            obs, info = self.venv.reset(options={"reset_mask": mask})
            infos = _split_infos(info, n)
            rows = unstack_batch(obs)
            for i in masked:
                firsts[i] = (rows[i], infos[i])
                self._done[i] = False
        if same_step:
            firsts.update(self._stash)
            self._stash.clear()
        ids = sorted(firsts)
        self._pending_reset.difference_update(ids)
        return self._first_rows(ids, [firsts[i][0] for i in ids], [firsts[i][1] for i in ids])

    def _step_round(self, same_step: bool) -> EnvRows:
        """One vector step of every sub-env (placeholders for those NEXT_STEP resets)."""
        n, pending = self.num_envs, self._pending_reset
        acts = []
        for i in range(n):
            a = self._actions.pop(i, None)
            if a is None:
                if i not in pending:
                    raise RuntimeError(f"sub-env {i} of the vector env has no action to step")
                a = self._placeholder  # NEXT_STEP: ignored, the vector env resets this one
            acts.append(a)
        obs, rew, term, trunc, info = self.venv.step(stack_samples(self._act_space, acts))
        infos = _split_infos(info, n)
        first = np.zeros(n, dtype=bool)
        first[list(pending)] = True
        pending.clear()
        term = np.asarray(term, dtype=bool) & ~first
        trunc = np.asarray(trunc, dtype=bool) & ~first
        self._done = term | trunc
        if same_step and self._done.any():
            obs = self._stash_resets(obs, info, infos)
        return self._rows(list(range(n)), obs, rew, term, trunc, infos, first)

    def _stash_resets(self, obs: Any, info: dict, infos: list[dict]) -> Any:
        """SAME_STEP: keep the reset observations of finished sub-envs for the next poll and
        put their final observations (and infos) in their place; returns the observations."""
        rows = unstack_batch(obs)
        finals = _split_infos(info["final_info"], self.num_envs) if "final_info" in info else None
        for i in np.flatnonzero(self._done).tolist():
            reset_info = {k: v for k, v in infos[i].items() if k not in ("final_obs", "final_info")}
            self._stash[i] = (rows[i], reset_info)
            rows[i] = info["final_obs"][i]
            infos[i] = finals[i] if finals is not None else {}
        return stack_samples(self._obs_space, rows)

    def close(self) -> None:
        """Close the vector env and its sub-envs."""
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
