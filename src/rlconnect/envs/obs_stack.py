"""One batch of a poll's single-agent observations, checked against their space."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.errors import EnvCheckError, describe_exception
from rlconnect.spaces import describe_space, stack_samples, unstack_batch, zeros_batch

__all__ = ["ObsStacker", "fits_dtype"]


class ObsStacker:
    """``stacker(obs, ids) -> (batch, bad)``: the ``StackFn`` of sub-envs that share
    ``space`` (``EnvRowsBuilder.build``). Errors name each sub-env's ``agent`` (None: the
    sub-env alone, for the agents of multi-agent envs that share one space)."""

    def __init__(self, space: gym.Space, agent: Any = DEFAULT_AGENT_ID) -> None:
        self.space = space
        self.agent = agent
        box = isinstance(space, gym.spaces.Box)
        self.shape = space.shape if box else None
        self.dtype = space.dtype if box else None

    def __call__(self, obs: list[Any], ids: list[int]) -> tuple[Any, dict[int, EnvCheckError]]:
        """One batch (one array for Box spaces, in the space's dtype), and the sub-envs whose
        observation cannot be one of the space.

        Observations of another dtype of the same kind are cast (float64 for float32,
        ints that fit for another int type). A wrong shape or dtype kind (a cast would hide
        it) or a wrong structure is reported per sub-env as an ``EnvCheckError`` naming
        every sub-env that returned one; their rows hold a placeholder until the caller
        drops them.
        """
        if self.shape is None or self.dtype is None:
            try:
                return stack_samples(self.space, obs), {}
            except Exception:  # a wrong structure: find the culprits (error path only)
                return self._stack_replacing(obs, ids, self._bad_nested(obs, ids))
        shape, dtype = self.shape, self.dtype
        if not obs:
            return np.empty((0, *shape), dtype=dtype), {}
        try:
            arr = np.array(obs)  # the fastest stack of N equal arrays, and it keeps dtypes
        except (ValueError, TypeError):
            return self._stack_replacing(obs, ids, self._bad_box(obs, ids))
        if arr.dtype == dtype and arr.shape[1:] == shape:
            return arr, {}
        if arr.shape[1:] == shape and fits_dtype(arr, dtype):
            return arr.astype(dtype), {}
        return self._stack_replacing(obs, ids, self._bad_box(obs, ids))

    def _stack_replacing(
        self, obs: list[Any], ids: list[int], problems: dict[int, str]
    ) -> tuple[Any, dict[int, EnvCheckError]]:
        """Stack with a valid placeholder in place of each bad observation."""
        if not problems:  # stacking failed for a reason no single row shows
            problems = dict.fromkeys(ids, "observations that do not stack")
        who = "" if self.agent is None else f" / agent {self.agent!r}"
        error = EnvCheckError(
            f"env returned a bad observation: obs does not fit {describe_space(self.space)}"
            + (f" (shape {self.shape}, dtype {self.dtype})" if self.shape else "")
            + " in "
            + "; ".join(f"env {i}{who}: {p}" for i, p in problems.items())
        )
        filler = unstack_batch(zeros_batch(self.space, 1))[0]
        fixed = [filler if i in problems else o for i, o in zip(ids, obs)]
        return self(fixed, ids)[0], dict.fromkeys(problems, error)

    def _bad_box(self, obs: list[Any], ids: list[int]) -> dict[int, str]:
        """Observations of a wrong shape or dtype kind for the Box space."""
        shape, dtype = self.shape, np.dtype(self.dtype)
        problems: dict[int, str] = {}
        for i, o in zip(ids, obs):
            got = np.shape(o)
            if got != shape:
                problems[i] = f"wrong shape {got}"
            elif not fits_dtype(np.asarray(o), dtype):
                problems[i] = f"wrong dtype {np.asarray(o).dtype}"
        return problems

    def _bad_nested(self, obs: list[Any], ids: list[int]) -> dict[int, str]:
        """Observations that do not stack with a valid one (wrong structure or shapes)."""
        filler = unstack_batch(zeros_batch(self.space, 1))[0]
        problems: dict[int, str] = {}
        for i, o in zip(ids, obs):
            try:
                stack_samples(self.space, [filler, o])
            except Exception as exc:
                problems[i] = f"wrong structure ({describe_exception(exc)})"
        return problems


def fits_dtype(arr: np.ndarray, dtype: np.dtype) -> bool:
    """Whether ``arr`` can be cast to ``dtype`` without changing what it means."""
    if dtype.kind == "f":
        return arr.dtype.kind in "biuf"
    if dtype.kind in "iu" and arr.dtype.kind in "biu":
        if not arr.size or np.can_cast(arr.dtype, dtype):
            return True
        info = np.iinfo(dtype)
        return bool(arr.min() >= info.min and arr.max() <= info.max)
    return np.can_cast(arr.dtype, dtype)
