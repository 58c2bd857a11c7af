"""Batch membership: per-row `batch_in_space`, and `check_batch` errors naming fields and rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlconnect.spaces._common import _LEAVES, _leaf_shape, _nrows, _rows_text, _unsupported
from rlconnect.spaces.describe import describe_space

__all__ = ["Problem", "batch_in_space", "check_batch"]

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
        out.append((path, "NaN values", np.asarray(nan.any(axis=1))))
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
        assert isinstance(space, gs.Discrete | gs.MultiDiscrete)  # MultiBinary returned above
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
