"""Checks of raw observations (and rewards) served one step at a time, before any state.

A deployed policy (``rc.load_policy``) and the runner's own inference
(``runner.compute_single_action``) take observations from outside (a game server, a robot),
not from an env the runner checked, so every one is checked against the agent pipeline's
input space before it reaches a pipeline, where a NaN would stay in a session's state (an
RNN state, a frame stack) for good: structure (dict keys, tuple lengths), shape, dtype
(castable to the space's dtype under numpy's ``same_kind`` rule: no strings, objects, or
floats for an integer space), finiteness in the space's dtype (1e300 sent as float64
for a float32 space would be inf there), and Discrete / MultiDiscrete ranges. A failure
raises ``EnvCheckError`` naming the field, e.g. ``obs`` or ``obs['pos']``. Box bounds are not
enforced (envs often return values outside their declared bounds; the runner accepts them
too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.errors import EnvCheckError
from rlconnect.spaces import describe_space, stack_samples

__all__ = ["check_observation", "check_observations", "check_rewards"]


def _leaf(space: gym.Space, value: Any, rows: int | None, path: str) -> None:
    try:
        arr = np.asarray(value)
    except Exception as exc:  # ragged lists and the like: numpy refuses them
        raise EnvCheckError(f"{path}: not an array ({type(exc).__name__}: {exc})") from None
    shape = tuple(space.nvec.shape) if isinstance(space, gym.spaces.MultiDiscrete) else space.shape
    want = tuple(shape or ()) if rows is None else (rows, *(shape or ()))
    dtype = np.dtype(space.dtype)
    if arr.dtype.kind in "OUSVMm" or not np.can_cast(arr.dtype, dtype, "same_kind"):
        raise EnvCheckError(
            f"{path}: dtype {arr.dtype} cannot be cast to {space.dtype} (same_kind) for "
            f"{describe_space(space)}"
        )
    if arr.shape != want:
        raise EnvCheckError(
            f"{path}: wrong shape {arr.shape}, expected {want} for {describe_space(space)}"
        )
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
        raise EnvCheckError(f"{path}: non-finite values (NaN or inf)")
    if dtype.kind in "iuf" and arr.dtype.kind in "iuf" and arr.size and not _fits(arr, dtype):
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        raise EnvCheckError(
            f"{path}: values beyond what {dtype} holds ({info.min} to {info.max}): stored "
            f"as {dtype} they would become inf or wrap; send values within that range"
        )
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        start = np.asarray(space.start)
        size = np.asarray(space.n if isinstance(space, gym.spaces.Discrete) else space.nvec)
        if ((arr < start) | (arr >= start + size)).any():
            raise EnvCheckError(f"{path}: values outside {describe_space(space)}")
    if isinstance(space, gym.spaces.MultiBinary) and ((arr != 0) & (arr != 1)).any():
        raise EnvCheckError(f"{path}: values other than 0 and 1")


def _fits(arr: np.ndarray, dtype: np.dtype) -> bool:
    """Every value of ``arr`` is a finite value of ``dtype`` (cast there, none becomes inf
    or wraps); cheap when ``dtype`` holds every value of ``arr``'s dtype."""
    if np.can_cast(arr.dtype, dtype, "safe"):
        return True
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return bool(((arr >= info.min) & (arr <= info.max)).all())


def _check(space: gym.Space, value: Any, rows: int | None, path: str) -> None:
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(value, Mapping):
            raise EnvCheckError(f"{path}: expected a dict, got {type(value).__name__}")
        if set(value) != set(space.spaces):
            missing = [k for k in space.spaces if k not in value]
            extra = [k for k in value if k not in space.spaces]
            raise EnvCheckError(f"{path}: keys differ: missing {missing}, unexpected {extra}")
        for k, sub in space.spaces.items():
            _check(sub, value[k], rows, f"{path}[{k!r}]")
    elif isinstance(space, gym.spaces.Tuple):
        if not isinstance(value, tuple | list) or len(value) != len(space.spaces):
            raise EnvCheckError(f"{path}: expected a tuple of {len(space.spaces)} parts")
        for i, sub in enumerate(space.spaces):
            _check(sub, value[i], rows, f"{path}[{i}]")
    else:
        _leaf(space, value, rows, path)


def check_observation(space: gym.Space, obs: Any, path: str = "obs") -> None:
    """Check one observation of ``space``; ``EnvCheckError`` naming ``path`` (or a field
    below it, such as ``obs['pos']``)."""
    _check(space, obs, None, path)


def check_observations(space: gym.Space, obs: Any, rows: int | None) -> Any:
    """The batch of ``rows`` observations of ``space`` in ``obs``, checked.

    ``obs`` is a list of single observations (stacked here, as the runner stacks them) or
    a stacked batch; ``rows`` None takes the batch's own length. Raises ``EnvCheckError``
    naming the field.
    """
    if isinstance(obs, list):
        if rows is not None and len(obs) != rows:
            raise EnvCheckError(f"obs: {len(obs)} observations for {rows} sessions")
        for i, one in enumerate(obs):
            _check(space, one, None, "obs" if len(obs) == 1 else f"obs[{i}]")
        return stack_samples(space, obs)
    if rows is None:
        first = obs
        while isinstance(first, Mapping | tuple) and len(first):
            first = next(iter(first.values())) if isinstance(first, Mapping) else first[0]
        if np.ndim(first) == 0:
            raise EnvCheckError("obs: a batch needs a leading row axis (or pass a list)")
        rows = len(first)
    _check(space, obs, rows, "obs")
    return obs


def check_rewards(rewards: Any, rows: int) -> np.ndarray | None:
    """``rewards`` as float64 ``(rows,)`` (None stays None: zeros); ``EnvCheckError``
    naming ``reward`` for a wrong shape, a non-number or a non-finite value."""
    if rewards is None:
        return None
    try:
        arr = np.asarray(rewards, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise EnvCheckError(f"reward: not a number: {rewards!r:.80}") from None
    if arr.shape != (rows,):
        raise EnvCheckError(f"reward: {arr.size} values for {rows} rows")
    if not np.isfinite(arr).all():
        raise EnvCheckError("reward: non-finite values (NaN or inf)")
    return arr
