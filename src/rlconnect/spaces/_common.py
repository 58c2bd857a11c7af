"""Shared internals of `rlconnect.spaces`: the leaf-space nest, row counting, error text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlconnect.spaces.describe import describe_space

_LEAVES = (gs.Box, gs.Discrete, gs.MultiDiscrete, gs.MultiBinary)
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
    if isinstance(space, gs.MultiDiscrete):
        return tuple(space.nvec.shape)
    return tuple(space.shape or ())  # leaf spaces always have a shape


def _rows_text(rows: np.ndarray, row_labels: Sequence[Any] | None) -> str:
    shown = [
        str(row_labels[i]) if row_labels is not None else str(i) for i in rows[:_MAX_ROWS_SHOWN]
    ]
    more = f" and {len(rows) - _MAX_ROWS_SHOWN} more" if len(rows) > _MAX_ROWS_SHOWN else ""
    return ", ".join(shown) + more


def _nrows(space: gs.Space, batch: Any) -> int:
    """Rows of a batch, found by following the space (so list leaves work too)."""
    while isinstance(space, (gs.Tuple, gs.Dict)) and space.spaces:
        is_dict = isinstance(space, gs.Dict)
        key: Any = next(iter(space.spaces)) if is_dict else 0
        if not isinstance(batch, Mapping if is_dict else (tuple, list)):
            raise ValueError(f"expected a {type(space).__name__} batch, got {type(batch).__name__}")
        if (key not in batch) if is_dict else not batch:
            raise ValueError(f"batch has no part {key!r} for {describe_space(space)}")
        space, batch = space[key], batch[key]
    if np.ndim(batch) == 0:
        raise ValueError(f"cannot find the number of rows in a {type(batch).__name__}")
    return int(np.shape(batch)[0])
