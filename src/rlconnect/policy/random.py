"""RandomPolicy: batched, seeded sampling from the action space."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.policy.base import Policy, PolicyOutput, batch_size

__all__ = ["RandomPolicy", "sample_space_batch"]


def _sample_box(space: gym.spaces.Box, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of a Box, vectorized, following gymnasium's rules per element.

    Bounded elements are uniform, half-bounded ones shifted exponentials, unbounded ones
    standard normal; integer Boxes sample integers in ``[low, high]``.
    """
    shape = (n, *space.shape)
    low, high = space.low, space.high
    is_int = np.issubdtype(space.dtype, np.integer)
    if space.is_bounded("both"):
        if is_int:
            lo, hi = low.astype(np.int64), high.astype(np.int64)  # integer bounds already
            return rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64).astype(
                space.dtype
            )
        if np.issubdtype(space.dtype, np.floating):
            return rng.uniform(low, high, size=shape).astype(space.dtype)
    low_b, up_b = space.bounded_below, space.bounded_above
    out = rng.standard_normal(shape)
    only_low = low_b & ~up_b
    only_up = up_b & ~low_b
    both = low_b & up_b
    if only_low.any():
        out = np.where(only_low, rng.exponential(size=shape) + low, out)
    if only_up.any():
        out = np.where(only_up, high - rng.exponential(size=shape), out)
    if both.any():
        top = high + 1 if is_int else high  # floor() below maps [high, high + 1) to high
        uniform = rng.uniform(np.where(both, low, 0), np.where(both, top, 1), shape)
        out = np.where(both, uniform, out)
    if is_int:
        out = np.clip(np.floor(out), low, high)
    return out.astype(space.dtype)


def sample_space_batch(space: gym.Space, n: int, rng: np.random.Generator) -> Any:
    """Draw ``n`` samples of ``space`` with ``rng``, batched along a new leading axis.

    Discrete, MultiDiscrete, MultiBinary and Box are vectorized; Tuple and Dict recurse and
    return a tuple / dict of batched arrays; any other space falls back to per-row
    ``space.sample()`` on a private copy seeded from ``rng`` (an object array).
    """
    if isinstance(space, gym.spaces.Discrete):
        start = int(space.start)
        out = rng.integers(start, start + int(space.n), size=n)  # int64 by default
        return out.astype(space.dtype, copy=False)
    if isinstance(space, gym.spaces.MultiDiscrete):
        starts = np.asarray(space.start, dtype=np.int64)
        ends = starts + np.asarray(space.nvec, dtype=np.int64)
        out = rng.integers(starts, ends, size=(n, *space.shape), dtype=np.int64)
        return out.astype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return rng.integers(0, 2, size=(n, *space.shape), dtype=np.int8).astype(space.dtype)
    if isinstance(space, gym.spaces.Box):
        return _sample_box(space, n, rng)
    if isinstance(space, gym.spaces.Tuple):
        return tuple(sample_space_batch(s, n, rng) for s in space.spaces)
    if isinstance(space, gym.spaces.Dict):
        return {k: sample_space_batch(s, n, rng) for k, s in space.spaces.items()}
    private = copy.deepcopy(space)
    private.seed(int(rng.integers(2**31 - 1)))
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = private.sample()
    return out


def _is_tensor(x: Any) -> bool:
    """True for a torch tensor (without importing torch: none exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class RandomPolicy(Policy):
    """Samples uniformly (per gymnasium's rules) from the action space; ignores observations.

    Vectorized: each call draws its rows at once from the policy's own
    ``np.random.Generator`` (seeded by ``seed``), with ``sample_space_batch``. The same seed
    and sequence of calls give the same actions. Has no weights and no extra fetches.

    On the tensor path (``obs`` a torch tensor) the actions are torch tensors on ``obs``'s
    device, of the space's dtype, drawn by torch with ``self.torch_random``: a generator
    on that device, made at the first such call and seeded from ``seed`` (again when the
    device changes), so no host read happens; the distributions are the numpy path's, the
    draws are not. A batch that says its row count (an int ``num_rows``, the numpy
    runner's row views) is taken as numpy. Discrete, MultiDiscrete, MultiBinary, Box,
    Tuple and Dict spaces sample as tensors.

    >>> import gymnasium as gym, numpy as np
    >>> p = RandomPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4, start=1), seed=0)
    >>> actions, states, extra = p.compute_actions({"obs": np.zeros((5, 3), np.float32)})
    >>> actions.shape, states, extra
    ((5,), [], {})
    >>> bool(((actions >= 1) & (actions <= 4)).all())
    True
    """

    torch_random: Any = None
    """The ``torch.Generator`` of the tensor path (None until a call with tensor ``obs``)."""
    _sampler: Any = None  # its TensorSampler (the space's constants on the device)

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> PolicyOutput:
        """One action per row of ``input_batch["obs"]`` (``explore`` is ignored)."""
        rows = getattr(input_batch, "num_rows", None)
        if type(rows) is not int:
            obs = input_batch.get("obs")
            if type(obs) is np.ndarray:
                rows = obs.shape[0]
            elif _is_tensor(obs):
                return self._compute_actions_tensor(obs), [], {}
            else:
                rows = batch_size(input_batch)  # nests, and the error for a missing obs
        return sample_space_batch(self.action_space, rows, self.np_random), [], {}

    def _compute_actions_tensor(self, obs: Any) -> Any:
        """Actions as tensors on ``obs``'s device (see the class docstring)."""
        sampler = self._sampler
        if sampler is None or sampler.gen is not self.torch_random or sampler.device != obs.device:
            import torch

            from rlconnect.policy.random_torch import TensorSampler

            if self.torch_random is None or self.torch_random.device != obs.device:
                self.torch_random = torch.Generator(device=obs.device)
                self._seed_torch(self.torch_random)
            sampler = self._sampler = TensorSampler(self.torch_random)
        return sampler.sample(self.action_space, obs.shape[0])

    def _seed_torch(self, gen: Any) -> None:
        if self._seed is None:
            gen.seed()
        else:
            gen.manual_seed(self._seed)

    def seed(self, seed: int | None = None) -> None:
        """Re-seed the numpy generator, and the torch one when there is one."""
        super().seed(seed)
        if self.torch_random is not None:
            self._seed_torch(self.torch_random)
