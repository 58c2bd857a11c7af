"""Batch layout of a space: flatten to float32 vectors, stack/unstack rows, zeros, row count.

A *batch* of a space is the stacked structure of B samples; see `rlconnect.spaces`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tree
from gymnasium import spaces as gs

from rlconnect.spaces._common import _leaf_shape, _nrows, _rows_text, _skeleton, _unsupported
from rlconnect.spaces.describe import describe_space

__all__ = [
    "batch_len",
    "flat_dim",
    "flatten_batch",
    "flatten_space",
    "stack_samples",
    "unstack_batch",
    "zeros_batch",
]


def flat_dim(space: gs.Space) -> int:
    """Length of the flat float32 vector of one sample (one-hot for Discrete/MultiDiscrete)."""
    if isinstance(space, gs.Discrete):
        return int(space.n)
    if isinstance(space, gs.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, (gs.Box, gs.MultiBinary)):
        return math.prod(space.shape)
    if isinstance(space, (gs.Tuple, gs.Dict)):
        parts = space.spaces.values() if isinstance(space, gs.Dict) else space.spaces
        return sum(flat_dim(s) for s in parts)
    raise _unsupported(space)


def _flat_bounds(space: gs.Space) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(space, gs.Box):
        return space.low.astype(np.float32).ravel(), space.high.astype(np.float32).ravel()
    if isinstance(space, (gs.Tuple, gs.Dict)):
        parts = [_flat_bounds(s) for s in tree.flatten(_skeleton(space))]
        lows = [p[0] for p in parts] or [np.zeros(0, np.float32)]
        return np.concatenate(lows), np.concatenate([p[1] for p in parts] or lows)
    d = flat_dim(space)
    return np.zeros(d, np.float32), np.ones(d, np.float32)


def flatten_space(space: gs.Space) -> gs.Box:
    """The float32 Box that `flatten_batch` maps into; one-hot and binary parts are [0, 1]."""
    low, high = _flat_bounds(space)
    return gs.Box(low, high, (low.size,), np.float32)


def _int_leaf(space: gs.Space, x: Any, n: int) -> np.ndarray:
    """Validated zero-based indices ``(n, k)`` of a Discrete/MultiDiscrete batch."""
    arr = np.asarray(x)
    if arr.shape != (n, *_leaf_shape(space)):
        raise ValueError(
            f"{describe_space(space)}: expected shape {(n, *_leaf_shape(space))}, got {arr.shape}"
        )
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{describe_space(space)}: expected integers, got dtype {arr.dtype}")
    idx = arr.reshape(n, -1).astype(np.int64) - np.asarray(space.start, np.int64).reshape(-1)
    bad = (
        (idx < 0)
        | (idx >= np.asarray(space.n if isinstance(space, gs.Discrete) else space.nvec).reshape(-1))
    ).any(axis=1)
    if bad.any():
        raise ValueError(
            f"{describe_space(space)}: values out of range in rows "
            f"{_rows_text(np.flatnonzero(bad), None)}"
        )
    return idx


def _flatten_leaf(space: gs.Space, x: Any, n: int) -> np.ndarray:
    if isinstance(space, (gs.Discrete, gs.MultiDiscrete)):
        idx = _int_leaf(space, x, n)
        sizes = np.asarray(space.nvec if isinstance(space, gs.MultiDiscrete) else [space.n])
        offsets = np.concatenate([[0], np.cumsum(sizes.ravel())[:-1]])
        out = np.zeros((n, flat_dim(space)), np.float32)
        out[np.arange(n)[:, None], offsets + idx] = 1.0
        return out
    arr = np.asarray(x)
    if arr.shape != (n, *space.shape):
        raise ValueError(
            f"{describe_space(space)}: expected shape {(n, *space.shape)}, got {arr.shape}"
        )
    return arr.reshape(n, -1).astype(np.float32)


def flatten_batch(space: gs.Space, batch: Any) -> np.ndarray:
    """Flatten a batch into ``(B, flat_dim)`` float32; out-of-range indices raise ValueError."""
    n = _nrows(space, batch)
    skel = _skeleton(space)
    parts = tree.flatten_up_to(
        skel, tree.map_structure_up_to(skel, lambda sp, x: _flatten_leaf(sp, x, n), skel, batch)
    )
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.float32)


def _stack_leaf(space: gs.Space, xs: Sequence[Any]) -> np.ndarray:
    arr = np.stack([np.asarray(x) for x in xs])
    if isinstance(space, gs.Discrete) and arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if isinstance(space, gs.MultiDiscrete) and arr.dtype.kind in "iu":
        return arr.astype(space.dtype)
    if isinstance(space, gs.MultiBinary) and arr.dtype.kind in "biu":
        return arr.astype(np.int8)
    return arr  # Box (and wrong kinds): keep the samples' dtype so `check_batch` can see it


def stack_samples(space: gs.Space, samples: Sequence[Any]) -> Any:
    """Stack single samples into a batch; Discrete ints become int64, Box keeps its dtype."""
    if len(samples) == 0:
        return zeros_batch(space, 0)
    skel = _skeleton(space)
    return tree.map_structure_up_to(skel, lambda sp, *xs: _stack_leaf(sp, xs), skel, *samples)


def unstack_batch(batch: Any) -> list[Any]:
    """Split a batch into its rows (the inverse of `stack_samples`), keeping the nest."""
    return [tree.map_structure(lambda x, i=i: x[i], batch) for i in range(batch_len(batch))]


def batch_len(batch: Any) -> int:
    """Number of rows: the leading size of the first leaf (dm-tree order)."""
    leaves = tree.flatten(batch)
    if not leaves or np.ndim(leaves[0]) == 0:
        raise ValueError("cannot find the number of rows: the batch has no array leaf")
    return int(np.shape(leaves[0])[0])


def zeros_batch(space: gs.Space, n: int) -> Any:
    """An n-row batch of zeros; Discrete/MultiDiscrete are filled with ``start`` (valid rows)."""

    def leaf(sp: gs.Space) -> np.ndarray:
        if isinstance(sp, gs.Discrete):
            return np.full(n, sp.start, np.int64)
        if isinstance(sp, gs.MultiDiscrete):
            return np.broadcast_to(sp.start, (n, *sp.nvec.shape)).astype(sp.dtype)
        return np.zeros((n, *sp.shape), sp.dtype)

    return tree.map_structure(leaf, _skeleton(space))
