"""Batch layout of a space: flatten to float32 vectors, stack/unstack rows, zeros, row count.

A *batch* of a space is the stacked structure of B samples; see `rlconnect.spaces`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import attrs
import numpy as np
import tree
from gymnasium import spaces as gs

from rlconnect.spaces._common import (
    _LEAVES,
    _leaf_shape,
    _nrows,
    _rows_text,
    _skeleton,
    _unsupported,
)
from rlconnect.spaces.describe import describe_space

__all__ = [
    "Flattener",
    "batch_len",
    "flat_dim",
    "flatten_batch",
    "flatten_space",
    "make_flattener",
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


def _int_leaf(space: gs.Discrete | gs.MultiDiscrete, x: Any, n: int) -> np.ndarray:
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
    shape = (n, *_leaf_shape(space))
    if arr.shape != shape:
        raise ValueError(f"{describe_space(space)}: expected shape {shape}, got {arr.shape}")
    return arr.reshape(n, -1).astype(np.float32)


def _flatten_reference(space: gs.Space, batch: Any) -> np.ndarray:
    """The dm-tree reference: the slow path that words every error `flatten_batch` raises."""
    n = _nrows(space, batch)
    skel = _skeleton(space)
    parts = tree.flatten_up_to(
        skel, tree.map_structure_up_to(skel, lambda sp, x: _flatten_leaf(sp, x, n), skel, batch)
    )
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), np.float32)


class _Mismatch(Exception):
    """The fast path met something unusual: the reference path answers (or words the error)."""


_SEQS = (tuple, list)


@attrs.frozen(eq=False)
class _Leaf:
    """Where one leaf sits in the batch nest and in the flat output row."""

    path: tuple[tuple[Any, bool], ...]  # (key, parent is a Dict) per level, from the root
    shape: tuple[int, ...]  # a row's shape (``nvec.shape`` for MultiDiscrete)
    lo: int  # first output column
    hi: int  # one past the last output column (for one-hot leaves: lo + number of indices)


def _one_hot_parts(
    space: gs.Discrete | gs.MultiDiscrete, lo: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start, size, first column)`` of each index of a Discrete/MultiDiscrete leaf."""
    sizes = np.asarray(space.nvec if isinstance(space, gs.MultiDiscrete) else [space.n]).ravel()
    start = np.asarray(space.start, np.int64).reshape(-1)
    cols = lo + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return start, sizes.astype(np.uint64), cols


class Flattener:
    """`flatten_batch` for one space, planned once: ``Flattener(space)(batch)``.

    The plan lists every leaf's place in the nest and its output columns, so a call only
    indexes the batch's dicts and tuples, copies Box/MultiBinary parts into one
    preallocated ``(B, flat_dim)`` float32 array by slice, and sets all one-hot entries in
    one step. Results and errors are those of `flatten_batch`: anything unusual (a wrong
    structure, a bad leaf, zero rows) goes to the dm-tree reference path, which returns
    the same array or raises the usual error. The space is taken as immutable.
    """

    __slots__ = ("_boxes", "_cols", "_eye", "_first", "_ints", "_reference_only", "_sizes",
                 "_start", "dim", "space")  # fmt: skip

    def __init__(self, space: gs.Space) -> None:
        skel = _skeleton(space)  # TypeError for unsupported spaces
        self.space = space
        self.dim = flat_dim(space)
        boxes: list[_Leaf] = []
        ints: list[_Leaf] = []
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        lo = k = 0  # next output column, next one-hot index
        for keys, sp in tree.flatten_with_path(skel):  # dm-tree order = `flatten_batch` order
            path, width = _steps(space, keys), flat_dim(sp)
            if isinstance(sp, (gs.Discrete, gs.MultiDiscrete)):
                parts.append(_one_hot_parts(sp, lo))
                ints.append(_Leaf(path, _leaf_shape(sp), k, k + len(parts[-1][0])))
                k = ints[-1].hi
            else:
                boxes.append(_Leaf(path, tuple(sp.shape), lo, lo + width))
            lo += width
        self._boxes, self._ints = tuple(boxes), tuple(ints)
        start, sizes, cols = (
            np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)
            for i in range(3)
        )
        self._start = start.astype(np.int64) if start.any() else None
        self._sizes, self._cols = sizes.astype(np.uint64), cols.astype(np.int64)
        leaves = (*boxes, *ints)
        self._first = _first_path(space)  # `_nrows` counts rows on this leaf
        # empty nests and zero-width leaves are the reference path's odd cases: keep them exact
        self._reference_only = all(f.path != self._first for f in leaves) or any(
            f.hi == f.lo for f in leaves
        )
        #: a plain Discrete space (observations of many turn-based and grid envs): each
        #: sample's one-hot row is a row of this identity, taken in one call
        self._eye = np.eye(self.dim, dtype=np.float32) if type(space) is gs.Discrete else None

    def __call__(self, batch: Any) -> np.ndarray:
        """``batch`` flattened to ``(B, flat_dim)`` float32: the planned fast path, falling
        back to the reference one (which raises naming the problem) when it cannot."""
        if not self._reference_only:
            try:
                return self._fast(batch) if self._eye is None else self._one_hot(batch)
            except Exception:  # the reference path returns the same array or raises the error
                pass
        return _flatten_reference(self.space, batch)

    def _one_hot(self, batch: Any) -> np.ndarray:
        eye = cast(np.ndarray, self._eye)
        idx = batch if type(batch) is np.ndarray else np.asarray(batch)
        if idx.ndim != 1 or idx.dtype.kind not in "iu" or not len(idx):
            raise _Mismatch
        start = int(self.space.start)  # type: ignore[attr-defined]
        pos = idx - start if start else idx
        if pos.dtype.kind == "i" and pos.min() < 0:  # (take would wrap it)
            raise _Mismatch
        out: np.ndarray = eye.take(pos, axis=0, mode="raise")  # IndexError past the end
        return out

    def _fast(self, batch: Any) -> np.ndarray:
        first = np.asarray(_get(batch, self._first))
        n = first.shape[0] if first.ndim else 0
        if n == 0:
            raise _Mismatch
        out = np.zeros((n, self.dim), np.float32)
        for leaf in self._boxes:
            arr = np.asarray(_get(batch, leaf.path))
            if arr.shape[:1] != (n,) or arr.shape[1:] != leaf.shape:
                raise _Mismatch
            out[:, leaf.lo : leaf.hi] = arr.reshape(n, leaf.hi - leaf.lo)
        if not self._ints:
            return out
        idx = []
        for leaf in self._ints:
            arr = np.asarray(_get(batch, leaf.path))
            if arr.shape[:1] != (n,) or arr.shape[1:] != leaf.shape or arr.dtype.kind not in "iu":
                raise _Mismatch
            idx.append(arr.reshape(n, leaf.hi - leaf.lo))
        # a fresh int64 (n, k) array: uint64 wraps as in the reference path's astype
        flat = np.concatenate(idx, axis=1, dtype=np.int64, casting="unsafe")
        if self._start is not None:
            flat -= self._start
        if np.count_nonzero(flat.view(np.uint64) >= self._sizes):  # negatives wrap to huge
            raise _Mismatch
        flat += self._cols
        out[np.arange(n)[:, None], flat] = 1.0
        return out


def _get(batch: Any, path: tuple[tuple[Any, bool], ...]) -> Any:
    for key, in_dict in path:
        if (type(batch) is not dict) if in_dict else (type(batch) not in _SEQS):
            raise _Mismatch
        batch = batch[key]
    return batch


def _steps(space: Any, keys: tuple[Any, ...]) -> tuple[tuple[Any, bool], ...]:
    steps = []
    for key in keys:
        steps.append((key, isinstance(space, gs.Dict)))
        space = space.spaces[key]
    return tuple(steps)


def _first_path(space: Any) -> tuple[tuple[Any, bool], ...]:
    steps = []
    while isinstance(space, (gs.Tuple, gs.Dict)) and space.spaces:
        is_dict = isinstance(space, gs.Dict)
        key: Any = next(iter(space.spaces)) if is_dict else 0
        steps.append((key, is_dict))
        space = space.spaces[key]
    return tuple(steps)


def make_flattener(space: gs.Space) -> Flattener:
    """A reusable `flatten_batch` for ``space``; TypeError if the space is unsupported."""
    return Flattener(space)


_CACHE: dict[int, Flattener] = {}
_CACHE_SIZE = 64


def _cached_flattener(space: gs.Space) -> Flattener:
    """The flattener of ``space`` (by identity; the cache holds the space, so ids stay valid)."""
    f = _CACHE.get(id(space))
    if f is None or f.space is not space:
        f = Flattener(space)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)), None)
        _CACHE[id(space)] = f
    return f


def flatten_batch(space: gs.Space, batch: Any) -> np.ndarray:
    """Flatten a batch into ``(B, flat_dim)`` float32; out-of-range indices raise ValueError."""
    try:
        f = _cached_flattener(space)
    except TypeError:  # unsupported space: the reference path raises in its usual order
        return _flatten_reference(space, batch)
    return f(batch)


def _stack_leaf(space: gs.Space, xs: Sequence[Any]) -> np.ndarray:
    if isinstance(space, gs.Discrete):  # scalars: one conversion (arrays of one shape stack)
        arr = np.array(xs)
        return arr.astype(np.int64, copy=False) if arr.dtype.kind in "iu" else arr
    arr = np.stack([np.asarray(x) for x in xs])
    if isinstance(space, gs.MultiDiscrete) and arr.dtype.kind in "iu":
        return arr.astype(space.dtype)
    if isinstance(space, gs.MultiBinary) and arr.dtype.kind in "biu":
        return arr.astype(np.int8)
    return arr  # Box (and wrong kinds): keep the samples' dtype so `check_batch` can see it


def stack_samples(space: gs.Space, samples: Sequence[Any]) -> Any:
    """Stack single samples into a batch; Discrete ints become int64, Box keeps its dtype."""
    if len(samples) == 0:
        return zeros_batch(space, 0)
    if isinstance(space, _LEAVES):  # a leaf space (the common case): no nest to walk
        return _stack_leaf(space, samples)
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
        return np.zeros((n, *_leaf_shape(sp)), sp.dtype)

    return tree.map_structure(leaf, _skeleton(space))
