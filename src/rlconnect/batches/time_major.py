"""``[T, N, ...]`` columns for learners written time-major (CleanRL-style PPO):
what `SampleBatch.time_major` returns.

A batch folds into ``N`` sub-envs ("slots": a (sub-env, agent) pair in a multi-agent
policy batch) of ``T`` rows each only when every slot has exactly ``T`` rows. The layout is
read from the batch, never assumed: the slot of each row is its ``env_id`` (with
``agent_index`` in a multi-agent policy batch, agent-major: all sub-envs of the first
agent, then the next), ``T`` is ``meta["rows_per_env"]`` when the batch carries it (the
runner sets it with ``RunnerConfig(equal_rows=True)`` and on the tensor path) and is
otherwise derived from the counts. Rows already in slot order (each slot's ``T`` rows
contiguous, slots ascending: what the runner hands out with ``equal_rows``) fold as a
view; otherwise they are gathered in slot order, keeping each slot's rows in batch order.
Within a slot the rows of one episode must come in increasing ``t``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches.take import take_rows
from rlconnect.batches.tensors import leaf_to_numpy

if TYPE_CHECKING:
    from rlconnect.batches.sample_batch import SampleBatch

__all__ = ["NOT_FOLDABLE", "ROWS_PER_ENV", "UNEQUAL_ROWS", "fold_time_major", "slot_layout"]

#: the batch meta key saying how many rows each sub-env (slot) has
ROWS_PER_ENV = "rows_per_env"
#: the batch meta key saying why its sub-envs have unequal rows (the error's fix)
UNEQUAL_ROWS = "unequal_rows"
#: the batch meta key saying why its rows must not be folded at all (e.g. the rows of
#: several runners, whose sub-envs share env ids)
NOT_FOLDABLE = "time_major_refused"

_EQUAL_ROWS = "sample with RunnerConfig(equal_rows=True), which gives every sub-env exactly "
_EQUAL_ROWS += "rollout_fragment_length rows"


def _slot_keys(batch: SampleBatch) -> np.ndarray:
    """One int64 key per row, equal for rows of one slot, ascending in slot order."""
    if "env_id" not in batch:
        raise ValueError(
            "time_major() needs an 'env_id' column to find each row's sub-env; "
            f"the batch has {sorted(batch.keys())}"
        )
    env = np.asarray(leaf_to_numpy(batch["env_id"]), dtype=np.int64).reshape(-1)
    agent = leaf_to_numpy(batch["agent_index"]) if "agent_index" in batch else None
    if agent is None or not len(env):
        return env
    agent = np.asarray(agent, dtype=np.int64).reshape(-1)
    width = int(env.max()) - int(env.min()) + 1
    return agent * width + (env - int(env.min()))


def slot_layout(batch: SampleBatch) -> tuple[np.ndarray | None, int]:
    """``(order, T)``: the row order that puts the batch in slot order (None: it already
    is) and the rows per slot. Raises ValueError when the slots' rows are not equal in
    number (naming ``RunnerConfig(equal_rows=True)``) or not in time order."""
    if NOT_FOLDABLE in batch.meta:
        raise ValueError(f"time_major() cannot fold this batch: {batch.meta[NOT_FOLDABLE]}")
    n = len(batch)
    keys = _slot_keys(batch)
    _, counts = np.unique(keys, return_counts=True)
    if n == 0:
        raise ValueError("time_major() of an empty batch: there is no T to fold by")
    if counts.min() != counts.max():
        raise ValueError(
            f"time_major() needs the same number of rows from every sub-env, but this "
            f"batch has {int(counts.min())} to {int(counts.max())} rows per sub-env over "
            f"{len(counts)} sub-envs; {batch.meta.get(UNEQUAL_ROWS, _EQUAL_ROWS)}"
        )
    rows = int(counts[0])
    declared = batch.meta.get(ROWS_PER_ENV)
    if declared is not None and int(declared) != rows:
        raise ValueError(
            f"batch.meta[{ROWS_PER_ENV!r}] says {declared} rows per sub-env, but each of its "
            f"{len(counts)} sub-envs has {rows} (a slice or take of a runner's batch?); "
            f"fold the runner's whole batch, or {_EQUAL_ROWS}"
        )
    in_order = bool(np.all(keys[1:] >= keys[:-1]))
    order = None if in_order else np.argsort(keys, kind="stable")
    _check_time_order(batch, keys if order is None else keys[order], order)
    return order, rows


def _check_time_order(batch: SampleBatch, keys: np.ndarray, order: np.ndarray | None) -> None:
    """Within a slot, consecutive rows of one episode must have increasing ``t``."""
    if "t" not in batch or "eps_id" not in batch:
        return
    t = np.asarray(leaf_to_numpy(batch["t"])).reshape(-1)
    eps = np.asarray(leaf_to_numpy(batch["eps_id"])).reshape(-1)
    if order is not None:
        t, eps = t[order], eps[order]
    same = (keys[1:] == keys[:-1]) & (eps[1:] == eps[:-1])
    bad = np.flatnonzero(same & (t[1:] <= t[:-1]))
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"time_major(): the rows of episode {int(eps[i])} are not in time order within "
            f"their sub-env (t={int(t[i])} then t={int(t[i + 1])}); keep each sub-env's rows "
            "in time order (as the runner builds them) before folding"
        )


def fold_time_major(batch: SampleBatch) -> dict[str, Any]:
    """Every column of ``batch`` shaped ``[T, N, ...]`` (see the module docstring)."""
    order, rows = slot_layout(batch)
    out = {}
    for name, column in batch.items():
        if order is not None:
            column = take_rows(column, order)
        out[name] = tree.map_structure(lambda leaf: _fold(leaf, rows), column)
    return out


def _fold(leaf: Any, rows: int) -> Any:
    slots = leaf.shape[0] // rows
    return leaf.reshape(slots, rows, *leaf.shape[1:]).swapaxes(0, 1)
