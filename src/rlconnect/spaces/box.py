"""Box action helpers: clip into bounds, and squash/unsquash between [-1, 1] and the bounds."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

__all__ = ["clip_to_space", "squash", "unsquash"]


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
