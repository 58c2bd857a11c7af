"""Rewards as the runner stores them: one float64 per row.

A reward that is an array of size one (common in wrapped simulators, e.g. ``np.array([1.0])``)
is taken as its scalar; any other shape, or a value that is not a number, is an
``EnvCheckError`` naming the sub-env, the agent and the field ``reward``.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlconnect.errors import EnvCheckError

__all__ = ["bad_reward_error", "reward_column", "scalar_reward"]

_SHOWN = 5


def scalar_reward(value: Any) -> float | None:
    """``value`` as a float (a number, or an array of size one), else None."""
    if type(value) is float:
        return value
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return float(arr.reshape(())) if arr.size == 1 else None


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)}"
    return f"{type(value).__name__} {reprlib.repr(value)}"


def bad_reward_error(env_id: int, bad: Sequence[tuple[Any, Any]]) -> EnvCheckError:
    """The error of sub-env ``env_id`` whose agents gave these ``(agent_id, reward)``."""
    where = "; ".join(
        f"env {env_id} / agent {agent!r}: reward is {_describe(value)}"
        for agent, value in bad[:_SHOWN]
    )
    return EnvCheckError(
        f"env returned a bad reward: {where} (a reward must be a number or an array of size one)"
    )


def reward_column(
    rewards: Any, env_ids: Sequence[int] | np.ndarray, agent_ids: Sequence[Any]
) -> tuple[np.ndarray, dict[int, BaseException]]:
    """One float64 reward per row, and a ``bad_reward_error`` per sub-env with a reward that
    is neither a number nor an array of size one (its entries are 0).

    A list of plain numbers (or an ``(R,)`` array) costs one ``np.asarray``; anything else
    (size-one arrays, a vector env's ``(R, 1)`` column, bad values) is looked at row by row.
    """
    n = len(env_ids)
    try:
        col = np.asarray(rewards, dtype=np.float64)
    except (TypeError, ValueError):
        col = None
    if col is not None and col.shape == (n,):
        return col, {}
    if col is not None and col.size == n and col.ndim > 1 and col.shape[0] == n:
        return col.reshape(n), {}  # e.g. a vector env's (R, 1) rewards
    out = np.zeros(n, dtype=np.float64)
    bad: dict[int, list[tuple[Any, Any]]] = {}
    per_row = list(rewards) if col is None or col.shape[:1] == (n,) else [rewards] * n
    for k, (e, a, value) in enumerate(zip(env_ids, agent_ids, per_row)):
        r = scalar_reward(value)
        if r is None:
            bad.setdefault(int(e), []).append((a, value))
        else:
            out[k] = r
    return out, {e: bad_reward_error(e, items) for e, items in bad.items()}
