"""Box action helpers: clip into bounds, and squash/unsquash between [-1, 1] and the bounds.

The ``*_tensor`` forms do the same on torch tensors, on their device (torch is imported only
when they run), with the bounds as tensors cached by the caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces as gs

from rlconnect.spaces.tensors import torch_dtype

__all__ = ["clip_to_space", "clip_to_space_tensor", "squash", "unsquash", "unsquash_tensor"]


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


TensorBounds = dict[tuple[str, Any, bool], tuple[Any, Any]]
"""A cache of a Box's bounds as tensors, by (device, dtype, finite); kept by the caller."""


def _bounds_on(space: gs.Box, like: Any, finite: bool, cache: TensorBounds) -> tuple[Any, Any]:
    """``space``'s bounds (``_finite_bounds`` with ``finite``) as tensors like ``like``."""
    import torch

    key = (str(like.device), like.dtype, finite)
    bounds = cache.get(key)
    if bounds is None:
        low, high = _finite_bounds(space) if finite else (space.low, space.high)
        as_t = torch.as_tensor
        bounds = (as_t(low, device=like.device), as_t(high, device=like.device))
        bounds = (bounds[0].to(like.dtype), bounds[1].to(like.dtype))
        cache[key] = bounds
    return bounds


def _wide(x: Any) -> Any:
    """float64, numpy's precision (float32 on ``mps``, which has no float64)."""
    import torch

    return torch.float32 if x.device.type == "mps" else torch.float64


def _cast_tensor(space: gs.Box, y: Any, cache: TensorBounds) -> Any:
    """``_cast`` for a float tensor: integers rounded (half to even), clipped, cast."""
    if space.dtype.kind in "iu":
        y = y.round()
    low, high = _bounds_on(space, y, False, cache)
    return y.clamp(min=low, max=high).to(torch_dtype(space.dtype))


def clip_to_space_tensor(space: gs.Box, x: Any, cache: TensorBounds) -> Any:
    """`clip_to_space` for a torch tensor, on its device, with numpy's type promotion."""
    import torch

    space = _box(space, "clip_to_space")
    if space.dtype.kind in "iu" or not x.dtype.is_floating_point:
        work = _wide(x)
    else:
        work = torch.promote_types(x.dtype, torch_dtype(space.dtype))
    return _cast_tensor(space, x.to(work), cache)


def unsquash_tensor(space: gs.Box, x: Any, cache: TensorBounds) -> Any:
    """`unsquash` for a torch tensor, on its device (in float64 as numpy; float32 on ``mps``)."""
    space = _box(space, "unsquash")
    x = x.to(_wide(x))
    low, high = _bounds_on(space, x, True, cache)
    c = x.clamp(-1.0, 1.0)
    return _cast_tensor(space, low + (c + 1.0) * 0.5 * (high - low), cache)
