"""Batched helpers for gymnasium spaces: flatten, stack, validate, squash, and a safe JSON codec.

A *batch* of a space is the stacked structure of B samples: Box -> array ``(B, *shape)``,
Discrete -> int64 ``(B,)``, MultiDiscrete -> ``(B, *nvec.shape)``, MultiBinary -> ``(B, *shape)``,
Tuple -> tuple of batches, Dict -> dict of batches (in ``space.spaces`` order). Everything works
on whole batches with numpy; Python loops run only over sub-spaces.

>>> from gymnasium.spaces import Dict, Discrete, Box
>>> sp = Dict({"a": Discrete(3, start=1), "b": Box(-1.0, 1.0, (2,))})
>>> flatten_batch(sp, {"a": np.array([1, 3]), "b": np.zeros((2, 2))})
array([[1., 0., 0., 0., 0.],
       [0., 0., 1., 0., 0.]], dtype=float32)
>>> describe_space(sp)
'Dict(a: Discrete(3, start=1), b: Box(-1.0, 1.0, (2,), float32))'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tree
from gymnasium import spaces as gs

__all__ = [
    "batch_in_space",
    "batch_len",
    "check_batch",
    "clip_to_space",
    "describe_space",
    "flat_dim",
    "flatten_batch",
    "flatten_space",
    "space_from_json",
    "space_to_json",
    "spaces_equal",
    "squash",
    "stack_samples",
    "unsquash",
    "unstack_batch",
    "zeros_batch",
]

_LEAVES = (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)
MAX_JSON_DEPTH = 32
MAX_JSON_ELEMENTS = 2**24
_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_BOX_DTYPES = ("float16", "float32", "float64", *_INT_DTYPES)
_MAX_ROWS_SHOWN = 5


def _unsupported(space: Any) -> TypeError:
    return TypeError(
        f"unsupported space {space!r}: expected Box, Discrete, MultiDiscrete, "
        "MultiBinary, or a Tuple/Dict of them"
    )


def _skeleton(space: gs.Space) -> Any:
    """The nest of leaf spaces (tuple for Tuple, dict for Dict), used to guide dm-tree."""
    if isinstance(space, gs.Tuple):
        return tuple(_skeleton(s) for s in space.spaces)
    if isinstance(space, gs.Dict):
        return {k: _skeleton(s) for k, s in space.spaces.items()}
    if isinstance(space, _LEAVES):
        return space
    raise _unsupported(space)


def _leaf_shape(space: gs.Space) -> tuple[int, ...]:
    return tuple(space.nvec.shape) if isinstance(space, gs.MultiDiscrete) else tuple(space.shape)


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


def _rows_text(rows: np.ndarray, row_labels: Sequence[Any] | None) -> str:
    shown = [
        str(row_labels[i]) if row_labels is not None else str(i) for i in rows[:_MAX_ROWS_SHOWN]
    ]
    more = f" and {len(rows) - _MAX_ROWS_SHOWN} more" if len(rows) > _MAX_ROWS_SHOWN else ""
    return ", ".join(shown) + more


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


def _nrows(space: gs.Space, batch: Any) -> int:
    """Rows of a batch, found by following the space (so list leaves work too)."""
    while isinstance(space, (gs.Tuple, gs.Dict)) and space.spaces:
        is_dict = isinstance(space, gs.Dict)
        key = next(iter(space.spaces)) if is_dict else 0
        if not isinstance(batch, Mapping if is_dict else (tuple, list)):
            raise ValueError(f"expected a {type(space).__name__} batch, got {type(batch).__name__}")
        if (key not in batch) if is_dict else not batch:
            raise ValueError(f"batch has no part {key!r} for {describe_space(space)}")
        space, batch = space.spaces[key], batch[key]
    if np.ndim(batch) == 0:
        raise ValueError(f"cannot find the number of rows in a {type(batch).__name__}")
    return int(np.shape(batch)[0])


def zeros_batch(space: gs.Space, n: int) -> Any:
    """An n-row batch of zeros; Discrete/MultiDiscrete are filled with ``start`` (valid rows)."""

    def leaf(sp: gs.Space) -> np.ndarray:
        if isinstance(sp, gs.Discrete):
            return np.full(n, sp.start, np.int64)
        if isinstance(sp, gs.MultiDiscrete):
            return np.broadcast_to(sp.start, (n, *sp.nvec.shape)).astype(sp.dtype)
        return np.zeros((n, *sp.shape), sp.dtype)

    return tree.map_structure(leaf, _skeleton(space))


# -- membership ------------------------------------------------------------------------------

Problem = tuple[str, str, "np.ndarray | None"]  # (path, reason, bad rows mask or None = all)


def _leaf_problems(space: gs.Space, x: Any, n: int, path: str) -> list[Problem]:
    arr = np.asarray(x)
    shape = (n, *_leaf_shape(space))
    if arr.shape != shape:
        return [(path, f"wrong shape: expected {shape}, got {arr.shape}", None)]
    integral = isinstance(space, (gs.Discrete, gs.MultiDiscrete)) or (
        isinstance(space, gs.Box) and space.dtype.kind in "iu"
    )
    if arr.dtype.kind not in ("iu" if integral else "biuf"):
        want = "integers" if integral else "numbers"
        return [(path, f"wrong dtype: got {arr.dtype}, expected {want}", None)]
    flat = arr.reshape(n, -1)
    out: list[Problem] = []
    nan = np.isnan(flat) if arr.dtype.kind == "f" else np.zeros(flat.shape, bool)
    if nan.any():
        out.append((path, "NaN values", nan.any(axis=1)))
    if isinstance(space, gs.MultiBinary):
        bad = (flat != 0) & (flat != 1) & ~nan
        if bad.any():
            out.append(
                (path, f"values other than 0 and 1 (e.g. {flat[bad][0].item()!r})", bad.any(1))
            )
        return out
    if isinstance(space, gs.Box):
        low, high = space.low.reshape(-1), space.high.reshape(-1)
    else:
        low = np.asarray(space.start).reshape(-1)
        high = low + np.asarray(space.n if isinstance(space, gs.Discrete) else space.nvec) - 1
        high = high.reshape(-1)
    bad = (flat < low) | (flat > high)
    inf = np.isinf(flat) if arr.dtype.kind == "f" else np.zeros(flat.shape, bool)
    if (bad & inf).any():
        out.append((path, "infinite values outside bounds", (bad & inf).any(axis=1)))
    if (bad & ~inf).any():
        uniform = np.all(low == low[0]) and np.all(high == high[0])
        bounds = f"[{low[0]}, {high[0]}]" if uniform else "the bounds"
        out.append(
            (
                path,
                f"values outside {bounds} (e.g. {flat[bad & ~inf][0].item()!r})",
                (bad & ~inf).any(axis=1),
            )
        )
    return out


def _problems(space: gs.Space, batch: Any, n: int, path: str) -> list[Problem]:
    if isinstance(space, gs.Tuple):
        if not isinstance(batch, (tuple, list)) or len(batch) != len(space.spaces):
            got = (
                f"{type(batch).__name__} of {len(batch)}"
                if isinstance(batch, (tuple, list))
                else type(batch).__name__
            )
            return [(path, f"expected a tuple of {len(space.spaces)} parts, got {got}", None)]
        return [
            p for i, s in enumerate(space.spaces) for p in _problems(s, batch[i], n, f"{path}[{i}]")
        ]
    if isinstance(space, gs.Dict):
        if not isinstance(batch, Mapping):
            return [(path, f"expected a dict, got {type(batch).__name__}", None)]
        out: list[Problem] = []
        missing = [k for k in space.spaces if k not in batch]
        extra = [k for k in batch if k not in space.spaces]
        if missing or extra:
            out.append((path, f"keys differ: missing {missing}, unexpected {extra}", None))
        return out + [
            p
            for k, s in space.spaces.items()
            if k in batch
            for p in _problems(s, batch[k], n, f"{path}[{k!r}]")
        ]
    if isinstance(space, _LEAVES):
        return _leaf_problems(space, batch, n, path)
    raise _unsupported(space)


def batch_in_space(space: gs.Space, batch: Any) -> np.ndarray:
    """Per-row membership, shape ``(B,)``; NaN is never inside, a wrong shape fails every row."""
    n = _nrows(space, batch)
    ok = np.ones(n, bool)
    for _, _, rows in _problems(space, batch, n, ""):
        ok &= False if rows is None else ~rows
    return ok


def check_batch(
    space: gs.Space, batch: Any, *, field: str = "obs", row_labels: Sequence[Any] | None = None
) -> None:
    """Raise ValueError naming the field, each problem and its rows when a batch does not fit."""
    try:
        n = _nrows(space, batch)
    except ValueError as e:
        raise ValueError(f"{field}: {e} (space {describe_space(space)})") from None
    problems = _problems(space, batch, n, field)
    if not problems:
        return
    lines = [f"{field} does not fit {describe_space(space)} (batch of {n} rows):"]
    for path, reason, rows in problems:
        where = (
            "all rows" if rows is None else "rows " + _rows_text(np.flatnonzero(rows), row_labels)
        )
        lines.append(f"  - {path}: {reason} in {where}")
    raise ValueError("\n".join(lines))


# -- Box action helpers ----------------------------------------------------------------------


def _box(space: Any, what: str) -> gs.Box:
    if not isinstance(space, gs.Box):
        raise TypeError(f"{what} needs a Box space, got {space!r}")
    return space


def _cast(space: gs.Box, y: np.ndarray) -> np.ndarray:
    if space.dtype.kind in "iu":
        y = np.rint(y)
    return np.clip(y, space.low, space.high).astype(space.dtype)


def clip_to_space(space: gs.Box, x: Any) -> np.ndarray:
    """Clip ``x`` (one sample or a batch) into the Box bounds, in the space's dtype."""
    return _cast(_box(space, "clip_to_space"), np.asarray(x))


def _finite_bounds(space: gs.Box) -> tuple[np.ndarray, np.ndarray]:
    """Bounds as float64, with dims that have an infinite bound mapped to [-1, 1] (identity)."""
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    fin = np.isfinite(low) & np.isfinite(high)
    return np.where(fin, low, -1.0), np.where(fin, high, 1.0)


def unsquash(space: gs.Box, x: Any) -> np.ndarray:
    """Clip ``x`` to [-1, 1], then map linearly onto the Box bounds; the result always lies inside.

    Dimensions with an infinite bound get the clipped input unchanged (then clipped into that
    dimension's bounds). NaN inputs stay NaN.
    """
    low, high = _finite_bounds(_box(space, "unsquash"))
    c = np.clip(np.asarray(x, np.float64), -1.0, 1.0)
    return _cast(space, low + (c + 1.0) * 0.5 * (high - low))


def squash(space: gs.Box, x: Any) -> np.ndarray:
    """Inverse of `unsquash`: map Box values to [-1, 1] (not clipped); identity for infinite dims.

    Returns float32 (float64 for a float64 Box). Dims with ``low == high`` map to 0.
    """
    low, high = _finite_bounds(_box(space, "squash"))
    width = high - low
    y = 2.0 * (np.asarray(x, np.float64) - low) / np.where(width > 0, width, 1.0) - 1.0
    return np.where(width > 0, y, 0.0).astype(
        np.float64 if space.dtype == np.float64 else np.float32
    )


# -- comparing and describing ----------------------------------------------------------------


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def spaces_equal(a: gs.Space, b: gs.Space) -> bool:
    """Exact structural equality: type, shape, dtype, bounds (inf included), Dict key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, gs.Box):
        return a.dtype == b.dtype and _arrays_equal(a.low, b.low) and _arrays_equal(a.high, b.high)
    if isinstance(a, gs.Discrete):
        return (a.n, a.start, a.dtype) == (b.n, b.start, b.dtype)
    if isinstance(a, gs.MultiDiscrete):
        return (
            a.dtype == b.dtype
            and _arrays_equal(a.nvec, b.nvec)
            and _arrays_equal(np.asarray(a.start), np.asarray(b.start))
        )
    if isinstance(a, gs.MultiBinary):
        return a.shape == b.shape
    if isinstance(a, gs.Tuple):
        return len(a) == len(b) and all(map(spaces_equal, a.spaces, b.spaces))
    if isinstance(a, gs.Dict):
        return list(a.spaces) == list(b.spaces) and all(
            map(spaces_equal, a.spaces.values(), b.spaces.values())
        )
    return bool(a == b)


def describe_space(space: gs.Space) -> str:
    """Short human-readable form, e.g. ``Box(-inf, inf, (4,), float32)`` or ``Discrete(2)``."""
    if isinstance(space, gs.Box):
        lo, hi = space.low, space.high
        if lo.size and np.all(lo == lo.flat[0]) and np.all(hi == hi.flat[0]):
            return f"Box({lo.flat[0].item()}, {hi.flat[0].item()}, {space.shape}, {space.dtype})"
        return f"Box({space.shape}, {space.dtype})"
    if isinstance(space, gs.Discrete):
        start = f", start={int(space.start)}" if space.start else ""
        return f"Discrete({int(space.n)}{start})"
    if isinstance(space, gs.MultiDiscrete):
        start = f", start={space.start.tolist()}" if np.any(space.start) else ""
        return f"MultiDiscrete({space.nvec.tolist()}{start})"
    if isinstance(space, gs.MultiBinary):
        return f"MultiBinary({space.n})"
    if isinstance(space, gs.Tuple):
        return "Tuple(" + ", ".join(describe_space(s) for s in space.spaces) + ")"
    if isinstance(space, gs.Dict):
        return "Dict(" + ", ".join(f"{k}: {describe_space(s)}" for k, s in space.items()) + ")"
    if isinstance(space, gs.Text):
        return f"Text(min_length={space.min_length}, max_length={space.max_length})"
    return repr(space)


# -- JSON codec ------------------------------------------------------------------------------


def _enc_array(a: np.ndarray) -> Any:
    def num(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return v

    return tree.map_structure(num, a.tolist())


def space_to_json(space: gs.Space) -> dict[str, Any]:
    """Encode a space as pure JSON types (non-finite bounds as "inf", "-inf", "nan")."""
    kind = type(space).__name__
    if isinstance(space, gs.Box):
        return {
            "type": kind,
            "dtype": space.dtype.name,
            "shape": list(space.shape),
            "low": _enc_array(space.low),
            "high": _enc_array(space.high),
        }
    if isinstance(space, gs.Discrete):
        return {
            "type": kind,
            "n": int(space.n),
            "start": int(space.start),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gs.MultiDiscrete):
        return {
            "type": kind,
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gs.MultiBinary):
        return {"type": kind, "n": space.n if isinstance(space.n, int) else list(space.n)}
    if isinstance(space, gs.Tuple):
        return {"type": kind, "spaces": [space_to_json(s) for s in space.spaces]}
    if isinstance(space, gs.Dict):
        if not all(isinstance(k, str) for k in space.spaces):
            raise TypeError(f"only string Dict keys can be saved, got {list(space.spaces)}")
        return {"type": kind, "spaces": [[k, space_to_json(s)] for k, s in space.items()]}
    if isinstance(space, gs.Text):
        return {
            "type": kind,
            "min_length": space.min_length,
            "max_length": space.max_length,
            "charset": "".join(sorted(space.character_set)),
        }
    raise TypeError(f"cannot encode {space!r} as JSON")


# type -> (required fields, optional fields)
_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "Box": ({"shape", "low", "high"}, {"dtype"}),
    "Discrete": ({"n"}, {"start", "dtype"}),
    "MultiDiscrete": ({"nvec"}, {"start", "dtype"}),
    "MultiBinary": ({"n"}, set()),
    "Tuple": ({"spaces"}, set()),
    "Dict": ({"spaces"}, set()),
    "Text": ({"max_length"}, {"min_length", "charset"}),
}


def _int(v: Any, path: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{path}: expected an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{path}: {v} is outside [{lo}, {hi}]")
    return v


def _float(v: Any, path: str) -> float:
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{path}: expected a number or 'inf'/'-inf'/'nan', got {type(v).__name__}")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{path}: number too large") from None


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{path}: expected a list, got {type(v).__name__}")
    return v


def _dtype(v: Any, path: str, allowed: Sequence[str]) -> np.dtype:
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{path}: dtype {v!r} is not allowed; allowed: {list(allowed)}")
    return np.dtype(v)


def _shape(v: Any, path: str) -> tuple[int, ...]:
    dims = _list(v, path)
    if len(dims) > MAX_JSON_DEPTH:
        raise ValueError(f"{path}: more than {MAX_JSON_DEPTH} dimensions")
    shape = tuple(_int(d, f"{path}[{i}]", 0, MAX_JSON_ELEMENTS) for i, d in enumerate(dims))
    if math.prod(shape) > MAX_JSON_ELEMENTS:
        raise ValueError(f"{path}: shape {shape} has more than {MAX_JSON_ELEMENTS} elements")
    return shape


def _infer_shape(v: Any, path: str) -> tuple[int, ...]:
    dims: list[int] = []
    while isinstance(v, list):
        if len(dims) >= MAX_JSON_DEPTH:
            raise ValueError(f"{path}: lists nested deeper than {MAX_JSON_DEPTH}")
        dims.append(len(v))
        if not v:
            break
        v = v[0]
    return tuple(dims)


def _nested(v: Any, shape: tuple[int, ...], path: str, leaf: Any) -> np.ndarray:
    """Parse nested lists that must have exactly ``shape``, leaf by leaf, into a float/int array."""
    items = [v]
    for depth, size in enumerate(shape):
        nxt: list[Any] = []
        for it in items:
            if not isinstance(it, list) or len(it) != size:
                raise ValueError(f"{path}: does not match shape {shape} at depth {depth}")
            nxt.extend(it)
        items = nxt
    vals = [leaf(x, path) for x in items]
    return np.array(vals, np.float64 if leaf is _float else object).reshape(shape)


def _array(v: Any, shape: tuple[int, ...], dtype: np.dtype, path: str) -> np.ndarray:
    """Bounds or counts of a declared shape, in ``dtype``; a scalar is broadcast."""
    leaf = _float if dtype.kind == "f" else _int
    if shape and not isinstance(v, list):
        return np.full(shape, _array(v, (), dtype, path), dtype)
    raw = _nested(v, shape, path, leaf)
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            arr = raw.astype(dtype)
        if np.any(np.isfinite(raw) & ~np.isfinite(arr)):
            raise ValueError(f"{path}: values do not fit {dtype}")
        return arr
    info = np.iinfo(dtype)
    if raw.size and (raw.min() < info.min or raw.max() > info.max):
        raise ValueError(f"{path}: values do not fit {dtype}")
    return raw.astype(dtype)


def _decode_leaf(kind: str, obj: dict[str, Any], path: str) -> gs.Space:
    if kind == "Box":
        dtype = _dtype(obj.get("dtype", "float32"), f"{path}.dtype", _BOX_DTYPES)
        shape = _shape(obj["shape"], f"{path}.shape")
        low = _array(obj["low"], shape, dtype, f"{path}.low")
        return gs.Box(low, _array(obj["high"], shape, dtype, f"{path}.high"), shape, dtype)
    if kind == "Discrete":
        dtype = _dtype(obj.get("dtype", "int64"), f"{path}.dtype", _INT_DTYPES)
        n = _int(obj["n"], f"{path}.n", 1)
        return gs.Discrete(n, start=_int(obj.get("start", 0), f"{path}.start"), dtype=dtype)
    if kind == "MultiDiscrete":
        dtype = _dtype(obj.get("dtype", "int64"), f"{path}.dtype", _INT_DTYPES)
        shape = _infer_shape(obj["nvec"], f"{path}.nvec")
        nvec = _array(_list(obj["nvec"], f"{path}.nvec"), shape, dtype, f"{path}.nvec")
        start = _array(obj.get("start", 0), shape, dtype, f"{path}.start")
        return gs.MultiDiscrete(nvec, dtype=dtype, start=start)
    if kind == "MultiBinary":
        n = obj["n"]
        if isinstance(n, list):
            return gs.MultiBinary(list(_shape(n, f"{path}.n")))
        return gs.MultiBinary(_int(n, f"{path}.n", 1, MAX_JSON_ELEMENTS))
    charset = obj.get("charset")
    if charset is not None and (not isinstance(charset, str) or len(charset) > 2**16):
        raise ValueError(f"{path}.charset: expected a string of at most 65536 characters")
    return gs.Text(
        _int(obj["max_length"], f"{path}.max_length", 0, MAX_JSON_ELEMENTS),
        min_length=_int(obj.get("min_length", 1), f"{path}.min_length", 0),
        **({} if charset is None else {"charset": charset}),
    )


def _decode(obj: Any, path: str, depth: int) -> gs.Space:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{path}: spaces nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected an object with a 'type', got {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise ValueError(
            f"{path}.type: unknown space type {kind!r}; known types: {sorted(_FIELDS)}"
        )
    required, optional = _FIELDS[kind]
    keys = set(obj) - {"type"}
    if required - keys:
        raise ValueError(f"{path}: {kind} is missing field(s) {sorted(required - keys)}")
    if keys - required - optional:
        raise ValueError(
            f"{path}: {kind} has unexpected field(s) "
            f"{sorted(map(repr, keys - required - optional))}"
        )
    if kind == "Tuple":
        subs = _list(obj["spaces"], f"{path}.spaces")
        return gs.Tuple([_decode(s, f"{path}.spaces[{i}]", depth + 1) for i, s in enumerate(subs)])
    if kind == "Dict":
        pairs = _list(obj["spaces"], f"{path}.spaces")
        items: list[tuple[str, gs.Space]] = []
        for i, pair in enumerate(pairs):
            p = f"{path}.spaces[{i}]"
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ValueError(f"{p}: expected a [key, space] pair with a string key")
            if any(pair[0] == k for k, _ in items):
                raise ValueError(f"{p}: duplicate key {pair[0]!r}")
            items.append((pair[0], _decode(pair[1], f"{p}[1]", depth + 1)))
        return gs.Dict(items)
    try:
        return _decode_leaf(kind, obj, path)
    except ValueError as e:
        if str(e).startswith(path):  # our own message, already names the field
            raise
        raise ValueError(f"{path}: invalid {kind}: {e}") from None
    except Exception as e:  # gymnasium's own checks (AssertionError, TypeError, ...)
        raise ValueError(f"{path}: invalid {kind}: {e}") from None


def space_from_json(obj: Any) -> gs.Space:
    """Decode `space_to_json` output, strictly: this input may come from a hostile file.

    Raises ValueError naming the JSON path for unknown types, missing/extra/wrong-typed fields,
    dtypes outside a numeric allow-list, nesting deeper than 32, or shapes over 2**24 elements.
    """
    return _decode(obj, "$", 1)
