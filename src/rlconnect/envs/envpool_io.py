"""Sending actions to and receiving steps from an EnvPool pool, with or without its wrapper.

EnvPool's Python ``send`` / ``recv`` wrap two C++ calls, ``_send(list)`` / ``_recv()``, in
conversions that a runner needs none of for the common layout (one action array, one
observation array, flat infos): per poll the wrapper re-reads the pool's config (a dict
built each time), infers the players' env ids and rebuilds the state as a tree: ~22 us
of a ~117 us step at N=64 CartPole (``python benchmarks/bench_envpool_io.py``).
``pool_io(pool)`` calls the C++ methods directly when the pool has that layout and falls
back to the public API otherwise (dict actions or observations, several players, a pool
built by another EnvPool version that lacks them); both give the same arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PoolIO", "pool_io"]

#: the action keys of a single-player pool with one array action
_ACTION_KEYS = ["env_id", "players.env_id", "action"]
#: the state keys every step needs
_STEP_KEYS = ("obs", "reward", "done", "trunc", "elapsed_step", "info:env_id")


class PoolIO:
    """``send(actions, env_ids)`` and ``recv() -> (obs, reward, terminated, truncated,
    info)`` through EnvPool's public API (``info`` also holds ``elapsed_step``)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.action_dtype = np.dtype(pool.action_space.dtype)

    def send(self, actions: np.ndarray, env_ids: np.ndarray | None) -> None:
        """Actions for ``env_ids`` (int32; None: every env, in order)."""
        self.pool.send(actions, env_ids)

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rew, term, trunc, info = self.pool.recv()
        return obs, rew, term, trunc, info


class _DirectIO(PoolIO):
    """The same through the pool's C++ ``_send`` / ``_recv`` (see the module docstring)."""

    def __init__(self, pool: Any, keys: list[str]) -> None:
        super().__init__(pool)
        self.action_dtype = np.dtype(pool.spec.action_array_spec["action"].dtype)
        self._all = np.arange(int(pool.config["num_envs"]), dtype=np.int32)
        self._at = {k: keys.index(k) for k in _STEP_KEYS}
        # flat infos by name (players' ids are EnvPool's bookkeeping)
        self._infos = [
            (k[len("info:") :], i)
            for i, k in enumerate(keys)
            if k.startswith("info:") and not k.startswith("info:players.")
        ]

    def send(self, actions: np.ndarray, env_ids: np.ndarray | None) -> None:
        ids = self._all if env_ids is None else env_ids
        # a copy: EnvPool's threads read the actions after ``_send`` returns
        self.pool._send([ids, ids, np.array(actions, dtype=self.action_dtype)])

    def recv(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        state = self.pool._recv()
        at = self._at
        info = {name: state[i] for name, i in self._infos}
        info["elapsed_step"] = state[at["elapsed_step"]]
        trunc = state[at["trunc"]]
        term = np.greater(state[at["done"]], trunc)  # done and not truncated, in one call
        return state[at["obs"]], state[at["reward"]], term, trunc, info


def pool_io(pool: Any) -> PoolIO:
    """The direct I/O for pools with the common layout, the public one for the rest."""
    keys = getattr(pool, "_state_keys", None)
    if not isinstance(keys, list):
        return PoolIO(pool)
    direct = (
        all(k in keys for k in _STEP_KEYS)
        and not any(k.startswith("obs:") for k in keys)
        and all("." not in k for k in keys if k.startswith("info:") and "players." not in k)
        and getattr(pool, "_action_keys", None) == _ACTION_KEYS
        and pool.config.get("max_num_players", 1) == 1
        and callable(getattr(pool, "_send", None))
        and callable(getattr(pool, "_recv", None))
    )
    return _DirectIO(pool, keys) if direct else PoolIO(pool)
