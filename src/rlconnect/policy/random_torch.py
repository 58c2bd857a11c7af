"""Batched samples of a gymnasium space as torch tensors on a device (RandomPolicy's
tensor path), drawn with a ``torch.Generator`` on that device and no host read.

The rules per element are those of :func:`rlconnect.policy.random.sample_space_batch`
(uniform when bounded, shifted exponentials when half-bounded, standard normal when
unbounded; integer Boxes in ``[low, high]``): the same distributions, other draws.
Imported only when a policy meets tensor observations (``RandomPolicy`` itself never
imports torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = ["TensorSampler", "torch_dtype"]

F64 = torch.float64  # samples are drawn in float64, then cast to the space's dtype


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (``np.int64`` -> ``torch.int64``)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class TensorSampler:
    """Draws batches of samples of spaces as tensors on ``gen``'s device.

    The constants a space needs on the device (bounds, ``nvec``, masks) are copied there
    once, at its first sample, and kept: a copy to a device at every call would wait for
    the device's queue (a blocking host-to-device copy synchronises).
    """

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen
        self.device = gen.device
        self._consts: dict[tuple[int, str], Any] = {}

    def _const(self, space: gym.Space, name: str, make: Callable[[], Any]) -> Any:
        key = (id(space), name)
        value = self._consts.get(key)
        if value is None:
            value = self._consts[key] = make()
        return value

    def sample(self, space: gym.Space, n: int) -> Any:
        """``n`` samples of ``space``, batched along a new leading axis (a tuple / dict of
        them for Tuple and Dict spaces), each of the space's dtype.

        Raises:
            TypeError: for a space other than Discrete, MultiDiscrete, MultiBinary, Box,
                Tuple and Dict (their samples are no tensors: give such a policy numpy
                observations).
        """
        gen, device = self.gen, self.device
        if isinstance(space, gym.spaces.Discrete):
            start = int(space.start)
            out = torch.randint(start, start + int(space.n), (n,), generator=gen, device=device)
            return out.to(torch_dtype(space.dtype))
        if isinstance(space, gym.spaces.MultiDiscrete):
            nvec, starts = self._const(space, "nvec_start", lambda: self._nvec_start(space))
            u = torch.rand((n, *space.shape), generator=gen, dtype=F64, device=device)
            return ((u * nvec).floor().to(torch.int64) + starts).to(torch_dtype(space.dtype))
        if isinstance(space, gym.spaces.MultiBinary):
            out = torch.randint(0, 2, (n, *space.shape), generator=gen, device=device)
            return out.to(torch_dtype(space.dtype))
        if isinstance(space, gym.spaces.Box):
            return self._box(space, n)
        if isinstance(space, gym.spaces.Tuple):
            return tuple(self.sample(s, n) for s in space.spaces)
        if isinstance(space, gym.spaces.Dict):
            return {k: self.sample(s, n) for k, s in space.spaces.items()}
        raise TypeError(
            f"RandomPolicy cannot sample {space!r} as tensors (Discrete, MultiDiscrete, "
            "MultiBinary, Box, Tuple and Dict can): give it numpy observations"
        )

    def _nvec_start(self, space: gym.spaces.MultiDiscrete) -> tuple[torch.Tensor, torch.Tensor]:
        nvec = torch.as_tensor(np.asarray(space.nvec, np.float64), dtype=F64, device=self.device)
        return nvec, torch.as_tensor(np.asarray(space.start, np.int64), device=self.device)

    def _box(self, space: gym.spaces.Box, n: int) -> torch.Tensor:
        """``n`` samples of a Box (see the module docstring), in float64, cast at the end."""
        shape = (n, *space.shape)
        gen, device = self.gen, self.device
        c = self._const(space, "box", lambda: self._box_consts(space))
        out = c["start"] + c["span"] * torch.rand(shape, generator=gen, dtype=F64, device=device)
        if "only_low" in c:
            exp = torch.empty(shape, dtype=F64, device=device).exponential_(generator=gen)
            normal = torch.randn(shape, generator=gen, dtype=F64, device=device)
            out = torch.where(c["only_low"], c["low"] + exp, out)
            out = torch.where(c["only_up"], c["high"] - exp, out)
            out = torch.where(c["none"], normal, out)
        if "int_low" in c:
            out = torch.minimum(torch.maximum(out.floor(), c["int_low"]), c["int_high"])
        return out.to(c["dtype"])

    def _box_consts(self, space: gym.spaces.Box) -> dict[str, Any]:
        """A Box's bounds and masks on the device (only those its elements need)."""

        def on(x: Any) -> torch.Tensor:
            return torch.as_tensor(x, dtype=F64, device=self.device)

        is_int = np.issubdtype(space.dtype, np.integer)
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        below, above = space.bounded_below, space.bounded_above
        both = below & above
        top = high + 1 if is_int else high  # floor() maps [high, high + 1) to high
        c: dict[str, Any] = {
            "dtype": torch_dtype(space.dtype),
            "start": on(np.where(both, low, 0.0)),
            "span": on(np.where(both, top - low, 1.0)),
        }
        if not both.all():
            c["low"], c["high"] = on(np.where(below, low, 0.0)), on(np.where(above, high, 0.0))
            for name, mask in (
                ("only_low", below & ~above),
                ("only_up", above & ~below),
                ("none", ~(below | above)),
            ):
                c[name] = torch.as_tensor(mask, device=self.device)
        if is_int:
            c["int_low"], c["int_high"] = on(low), on(high)
        return c
