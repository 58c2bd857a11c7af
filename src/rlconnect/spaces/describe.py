"""Compare spaces exactly (`spaces_equal`) and name them briefly (`describe_space`)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces as gs

__all__ = ["describe_space", "spaces_equal"]


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def spaces_equal(a: gs.Space, b: gs.Space) -> bool:
    """Exact structural equality: type, shape, dtype, bounds (inf included), Dict key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, gs.Box) and isinstance(b, gs.Box):
        return a.dtype == b.dtype and _arrays_equal(a.low, b.low) and _arrays_equal(a.high, b.high)
    if isinstance(a, gs.Discrete) and isinstance(b, gs.Discrete):
        return (a.n, a.start, a.dtype) == (b.n, b.start, b.dtype)
    if isinstance(a, gs.MultiDiscrete) and isinstance(b, gs.MultiDiscrete):
        return (
            a.dtype == b.dtype
            and _arrays_equal(a.nvec, b.nvec)
            and _arrays_equal(np.asarray(a.start), np.asarray(b.start))
        )
    if isinstance(a, gs.MultiBinary):
        return a.shape == b.shape
    if isinstance(a, gs.Tuple) and isinstance(b, gs.Tuple):
        return len(a) == len(b) and all(map(spaces_equal, a.spaces, b.spaces))
    if isinstance(a, gs.Dict) and isinstance(b, gs.Dict):
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
