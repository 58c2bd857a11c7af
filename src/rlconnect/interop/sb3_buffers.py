"""`fill_sb3_buffer`: a batch's rows in a Stable-Baselines3 ``ReplayBuffer``.

SB3's ``ReplayBuffer.add`` takes one step of its ``n_envs`` envs at a time; this writes
all of a batch's rows at once, into the same arrays, as successive ``add`` calls would:
step ``k`` of the batch (rows ``k * n_envs`` to ``(k + 1) * n_envs``) at position
``(pos + k) % buffer_size``, and ``pos`` / ``full`` advanced as ``add`` advances them (a
batch longer than the buffer keeps its last ``buffer_size`` steps).

SB3's time-limit convention: ``dones`` is ``terminated or truncated`` and, when the buffer
was made with ``handle_timeout_termination=True`` (its default), ``timeouts`` is
``truncated and not terminated`` (what SB3's VecEnvs report as
``infos["TimeLimit.truncated"]``), so that a truncated step is bootstrapped from its
``next_observations`` (here: ``new_obs``, the true final observation) and only a
termination ends the return. ``actions`` are the policy's actions (the ``actions``
column), as SB3 stores what its policy output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.interop.errors import InteropError, import_peer, single_agent, with_columns

__all__ = ["fill_sb3_buffer"]

_NEEDED = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds")


def fill_sb3_buffer(batch: SampleBatch, buffer: Any) -> int:
    """Add every row of ``batch`` to the SB3 ``ReplayBuffer`` ``buffer``; returns the number
    of rows added (see the module docstring for the layout and SB3's time-limit flags).

    The rows must fill whole steps of the buffer's ``n_envs`` (``len(batch)`` a multiple
    of it); which env column a transition lands in does not matter to a replay buffer's
    uniform sampling.

    Raises:
        InteropError: if the buffer's spaces do not fit the batch (observation shape,
            action width, a discrete action outside the space), the rows are not a
            multiple of ``n_envs``, the buffer uses ``optimize_memory_usage`` (its
            ``next_observations`` are the following step's, which a batch of transitions
            does not promise), or a column is missing.
        TypeError: for a buffer that is not a ``ReplayBuffer`` (``DictReplayBuffer``
            included) or a ``MultiAgentBatch``.
    """
    buffers = import_peer("stable_baselines3.common.buffers", "sb3")
    batch = single_agent(batch, "fill_sb3_buffer")
    _check_buffer(buffer, buffers)
    with_columns(batch, _NEEDED, "fill_sb3_buffer")
    if len(batch) % buffer.n_envs:
        raise InteropError(
            f"fill_sb3_buffer: {len(batch)} rows do not fill whole steps of the buffer's "
            f"n_envs={buffer.n_envs}; make the buffer with n_envs=1 or pass a multiple"
        )
    b = batch.numpy()
    term = np.asarray(b["terminateds"], bool).reshape(-1)
    trunc = np.asarray(b["truncateds"], bool).reshape(-1)
    columns = {
        "observations": _observations(b["obs"], buffer, "obs"),
        "next_observations": _observations(b["new_obs"], buffer, "new_obs"),
        "actions": _actions(b["actions"], buffer),
        "rewards": np.asarray(b["rewards"], np.float32).reshape(-1),
        "dones": (term | trunc).astype(np.float32),
    }
    if buffer.handle_timeout_termination:
        columns["timeouts"] = (trunc & ~term).astype(np.float32)
    _write(buffer, columns, len(batch))
    return len(batch)


def _check_buffer(buffer: Any, buffers: Any) -> None:
    if isinstance(buffer, buffers.DictReplayBuffer) or not isinstance(buffer, buffers.ReplayBuffer):
        raise TypeError(
            "fill_sb3_buffer takes a stable_baselines3 ReplayBuffer (Box or Discrete "
            f"observations), got {type(buffer).__name__}"
        )
    if buffer.optimize_memory_usage:
        raise InteropError(
            "fill_sb3_buffer: the buffer was made with optimize_memory_usage=True, which "
            "reads each step's next observation from the following step; make it with "
            "optimize_memory_usage=False"
        )


def _observations(values: Any, buffer: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    shape = tuple(buffer.obs_shape)
    if arr.shape[1:] == () and shape == (1,):  # a Discrete observation space
        arr = arr.reshape(-1, 1)
    if arr.shape[1:] != shape:
        raise InteropError(
            f"fill_sb3_buffer: column {name!r} has rows of shape {arr.shape[1:]}, the "
            f"buffer's observation_space {buffer.observation_space} has {shape}; make the "
            "buffer with the observation space of the batch's obs (after the connectors)"
        )
    return arr


def _actions(values: Any, buffer: Any) -> np.ndarray:
    arr = np.asarray(values)
    width = int(np.prod(arr.shape[1:], dtype=np.int64))
    space = buffer.action_space
    bad_width = width != buffer.action_dim
    n = getattr(space, "n", None)
    out_of_space = n is not None and len(arr) and (arr.min() < 0 or arr.max() >= int(n))
    if bad_width or out_of_space:
        raise InteropError(
            f"fill_sb3_buffer: column 'actions' (rows of shape {arr.shape[1:]}, values "
            f"{arr.min() if len(arr) else '-'} to {arr.max() if len(arr) else '-'}) does not "
            f"fit the buffer's action_space {space}; make the buffer with the policy's "
            "action space"
        )
    return arr.reshape(len(arr), buffer.action_dim)


def _write(buffer: Any, columns: dict[str, np.ndarray], rows: int) -> None:
    """Step ``k`` (``n_envs`` rows) at ``(pos + k) % buffer_size``, as ``add`` would."""
    n_envs, size = buffer.n_envs, buffer.buffer_size
    steps = rows // n_envs
    skip = max(steps - size, 0)  # steps a smaller buffer would overwrite anyway
    kept = steps - skip
    where = (buffer.pos + skip + np.arange(kept)) % size
    for name, values in columns.items():
        target = getattr(buffer, name)
        kept_rows = values[skip * n_envs :]
        target[where] = kept_rows.reshape(kept, n_envs, *target.shape[2:])
    buffer.full = buffer.full or buffer.pos + steps >= size
    buffer.pos = (buffer.pos + steps) % size
