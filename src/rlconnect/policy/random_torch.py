"""Batched samples of a gymnasium space as torch tensors on a device (RandomPolicy's
tensor path), drawn with a ``torch.Generator`` on that device and no host read.

The rules per element are those of :func:`rlconnect.policy.random.sample_space_batch`
(uniform when bounded, shifted exponentials when half-bounded, standard normal when
unbounded; integer Boxes in ``[low, high]``): the same distributions, other draws.
Imported only when a policy meets tensor observations (``RandomPolicy`` itself never
imports torch).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = ["sample_space_tensors", "torch_dtype"]

F64 = torch.float64  # samples are drawn in float64, then cast to the space's dtype


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.int64`` -> ``torch.int64``)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _box(space: gym.spaces.Box, n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` samples of a Box (see the module docstring), in float64, cast at the end."""

    def on(x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=F64, device=device)

    shape = (n, *space.shape)
    is_int = np.issubdtype(space.dtype, np.integer)
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    below, above = space.bounded_below, space.bounded_above
    both = below & above
    top = high + 1 if is_int else high  # floor() below maps [high, high + 1) to high
    uniform = torch.rand(shape, generator=gen, dtype=F64, device=device)
    out = on(np.where(both, low, 0.0)) + on(np.where(both, top - low, 1.0)) * uniform
    if not both.all():
        exp = torch.empty(shape, dtype=F64, device=device).exponential_(generator=gen)
        normal = torch.randn(shape, generator=gen, dtype=F64, device=device)
        lo, hi = on(np.where(below, low, 0.0)), on(np.where(above, high, 0.0))
        out = torch.where(torch.as_tensor(below & ~above, device=device), lo + exp, out)
        out = torch.where(torch.as_tensor(above & ~below, device=device), hi - exp, out)
        out = torch.where(torch.as_tensor(~(below | above), device=device), normal, out)
    if is_int:
        out = torch.minimum(torch.maximum(out.floor(), on(low)), on(high))
    return out.to(torch_dtype(space.dtype))


def sample_space_tensors(
    space: gym.Space, n: int, gen: torch.Generator, device: torch.device
) -> Any:
    """Draw ``n`` samples of ``space`` with ``gen`` as tensors on ``device``, batched along
    a new leading axis (a tuple / dict of them for Tuple and Dict spaces), each of the
    space's dtype.

    Raises:
        TypeError: for a space other than Discrete, MultiDiscrete, MultiBinary, Box, Tuple
            and Dict (their samples are no tensors: give such a policy numpy observations).
    """
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        out = torch.randint(start, start + int(space.n), (n,), generator=gen, device=device)
        return out.to(torch_dtype(space.dtype))
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = torch.as_tensor(np.asarray(space.nvec, np.float64), dtype=F64, device=device)
        starts = torch.as_tensor(np.asarray(space.start, np.int64), device=device)
        u = torch.rand((n, *space.shape), generator=gen, dtype=F64, device=device)
        out = (u * nvec).floor().to(torch.int64) + starts
        return out.to(torch_dtype(space.dtype))
    if isinstance(space, gym.spaces.MultiBinary):
        shape = (n, *space.shape)
        return torch.randint(0, 2, shape, generator=gen, device=device).to(torch_dtype(space.dtype))
    if isinstance(space, gym.spaces.Box):
        return _box(space, n, gen, device)
    if isinstance(space, gym.spaces.Tuple):
        return tuple(sample_space_tensors(s, n, gen, device) for s in space.spaces)
    if isinstance(space, gym.spaces.Dict):
        return {k: sample_space_tensors(s, n, gen, device) for k, s in space.spaces.items()}
    raise TypeError(
        f"RandomPolicy cannot sample {space!r} as tensors (Discrete, MultiDiscrete, "
        "MultiBinary, Box, Tuple and Dict can): give it numpy observations"
    )
