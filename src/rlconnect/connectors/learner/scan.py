"""Segmented reverse scans over a whole batch: discounted sums within each trajectory.

Every built-in learner connector reduces to sums over the rows that follow a row in its
trajectory (up to the trajectory's last row; ``last``: each trajectory's last row, in row
order, as :class:`.trajectories.Trajectories` gives them):

- :func:`discounted_suffix_sum`: ``y[t] = x[t] + d * y[t+1]``, and after each
  trajectory's last row the value given for it (returns: a bootstrap, or 0);
- :func:`gae_columns`: the same over GAE's deltas, which it makes as it goes;
- :func:`linear_suffix_scan`: ``y[t] = x[t] + c[t] * y[t+1]`` with per-row ``c`` (V-trace);
- :func:`discounted_window_sum`: ``sum_{i < n} d**i * x[t+i]`` over at most ``n`` rows
  (n-step returns).

Each is one compiled pass over the batch (:mod:`._kernels`, numba), with no Python loop
over rows or trajectories: the recurrences from the batch's last row back to its first,
the windows as a suffix and a prefix sum inside blocks of ``n`` rows. Each row is read
once (twice for windows) and each output written once, which is what a batch of a
million rows costs to touch at all; every numpy formulation of a recurrence (block
matrix products, recursive doubling) needs several whole-array passes, and took about
twice as long on a batch of a million rows (docs/performance.md). The sums run in float64
and add each term once with its own power of the discount, as a sequential loop does,
with no subtraction (tests/connectors/learner/test_learner_scan.py holds them to such
loops on trajectories of up to 5000 rows with terms spanning six orders of magnitude).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

__all__ = [
    "compiled_input",
    "discounted_suffix_sum",
    "discounted_window_sum",
    "gae_columns",
    "kernels",
    "linear_suffix_scan",
]


def kernels() -> ModuleType:
    """:mod:`._kernels`, the compiled passes (these scans and the one that finds the
    trajectories), imported on first use: importing numba takes ~0.4 s."""
    from rlconnect.connectors.learner import _kernels

    return _kernels


#: the dtypes the compiled passes take as they are (native byte order)
_COMPILED_DTYPES = frozenset(
    np.dtype(f"{kind}{size}") for kind in "iu" for size in (1, 2, 4, 8)
) | {np.dtype(bool), np.dtype(np.float32), np.dtype(np.float64)}


def compiled_input(col: np.ndarray) -> np.ndarray:
    """``col`` as a compiled pass takes it: itself when its dtype is one numba compiles
    for, else a copy in native byte order (float16 and extended floats as float64)."""
    if col.dtype in _COMPILED_DTYPES:
        return col
    return col.astype(np.float64 if col.dtype.kind == "f" else col.dtype.newbyteorder("="))


def _ints(last: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(last, dtype=np.int64)


def discounted_suffix_sum(
    x: np.ndarray,
    last: np.ndarray,
    discount: float,
    after: np.ndarray | None = None,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """``y[t] = sum_{i=0..r} discount**i * x[t+i] + discount**(r+1) * after[k]`` for a
    row ``t`` of trajectory ``k`` with ``r`` rows after it in the trajectory (``after``: one
    value per trajectory, 0 when None), summed in float64 and returned as a new ``dtype``
    array (``x``, any real dtype, is left alone)."""
    after = np.zeros(len(last)) if after is None else np.asarray(after, dtype=np.float64)
    out = np.empty(len(x), dtype=dtype)
    kernels().discounted_sums(compiled_input(x), float(discount), _ints(last), after, out)
    return out


def gae_columns(
    rewards: np.ndarray,
    values: np.ndarray,
    last: np.ndarray,
    after: np.ndarray,
    gamma: float,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE's ``(advantages, value_targets)``, float32 (summed in float64): ``delta[t] =
    rewards[t] + gamma * values[t+1] - values[t]``, with ``after[k]`` as the value after
    trajectory ``k``'s last row, ``advantages[t] = delta[t] + gamma * lambda_ *
    advantages[t+1]`` and ``value_targets = advantages + values``."""
    advantages = np.empty(len(rewards), np.float32)
    targets = np.empty(len(rewards), np.float32)
    after = np.asarray(after, dtype=np.float64)
    decay = float(gamma) * float(lambda_)
    rewards, values = compiled_input(rewards), compiled_input(values)
    kernels().gae(rewards, values, _ints(last), after, float(gamma), decay, advantages, targets)
    return advantages, targets


def linear_suffix_scan(x: np.ndarray, coef: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``y[t] = x[t] + coef[t] * y[t+1]`` within each trajectory (``last``: the rows that
    end them): a new float64 (N,) array.

    ``coef`` is ignored on each trajectory's last row (nothing follows it there)."""
    out = np.empty(len(x))
    kernels().linear_sums(compiled_input(x), compiled_input(coef), _ints(last), out)
    return out


def discounted_window_sum(x: np.ndarray, last: np.ndarray, discount: float, n: int) -> np.ndarray:
    """``y[t] = sum_{i < n} discount**i * x[t+i]`` over the rows of ``t``'s trajectory
    (``last``: the rows that end them): a new float64 (N,) array. ``n`` >= 1 rows at most;
    a window longer than the longest trajectory is that trajectory's suffix sum."""
    longest = int(np.diff(last, prepend=-1).max()) if len(last) else 1
    powers = float(discount) ** np.arange(min(n, longest) + 1.0)
    out = np.empty(len(x))
    kernels().window_sums(compiled_input(x), powers, _ints(last), out)
    return out
