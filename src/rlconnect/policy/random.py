"""RandomPolicy: batched, seeded sampling from the action space."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.policy.base import Policy, PolicyOutput, batch_size

__all__ = ["RandomPolicy", "sample_space_batch"]

#: ``RandomPolicy`` draws this many bytes of actions at once (at most ``MAX_BLOCK_ROWS``
#: rows): one draw costs a few microseconds whether it is of 64 values or of 4,096
BLOCK_BYTES = 1 << 16
MAX_BLOCK_ROWS = 4096


class _Rows(int):
    """A row count as a ``size`` argument: numpy's ``Generator.integers`` first checks
    ``np.prod(size) == 0``, which costs about 4 us on a plain int (as much as drawing 64
    values); ``np.prod`` calls an argument's own ``prod()`` instead, and this one is the
    count itself. Same draws, same output shape."""

    __slots__ = ()

    def prod(self, axis: Any = None, dtype: Any = None, out: Any = None, **kwargs: Any) -> int:
        return int(self)


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
        out = rng.integers(start, start + int(space.n), size=_Rows(n))  # int64 by default
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


class RandomPolicy(Policy):
    """Samples uniformly (per gymnasium's rules) from the action space; ignores observations.

    Vectorized: actions of array spaces (Discrete, MultiDiscrete, MultiBinary, Box, and
    Tuple / Dict of them) are drawn a block of rows at a time from the policy's own
    ``np.random.Generator`` (seeded by ``seed``) and handed out in order, so most calls cost
    a slice (views of the block, which is never written to) rather than a draw; other
    spaces are sampled per call. The same seed and sequence of calls give the same actions.
    Has no weights and no extra fetches.

    >>> import gymnasium as gym, numpy as np
    >>> p = RandomPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4, start=1), seed=0)
    >>> actions, states, extra = p.compute_actions({"obs": np.zeros((5, 3), np.float32)})
    >>> actions.shape, states, extra
    ((5,), [], {})
    >>> bool(((actions >= 1) & (actions <= 4)).all())
    True
    """

    def seed(self, seed: int | None = None) -> None:
        """Re-seed the generator; actions drawn ahead are dropped."""
        super().seed(seed)
        #: rows drawn ahead (an array or a nest of arrays) and how many, in one attribute
        #: so that a call always slices a block together with its own length
        self._drawn: tuple[Any, int] = (None, 0)
        self._next = 0  # the first row not handed out yet
        self._block_rows = _block_rows(self.action_space)  # 0: draw per call

    def get_random_state(self) -> Any:
        """The generator's state and the rows drawn ahead (see ``Policy``)."""
        return super().get_random_state(), self._drawn, self._next

    def set_random_state(self, state: Any) -> None:
        generators, self._drawn, self._next = state
        super().set_random_state(generators)

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> PolicyOutput:
        """One action per row of ``input_batch["obs"]`` (``explore`` is ignored)."""
        n = batch_size(input_batch)
        if not self._block_rows:
            return sample_space_batch(self.action_space, n, self.np_random), [], {}
        (block, rows), start = self._drawn, self._next
        if start + n > rows:  # what is left of the block is dropped
            rows = max(n, self._block_rows)
            block = sample_space_batch(self.action_space, rows, self.np_random)
            self._drawn, start = (block, rows), 0
        self._next = end = start + n
        # the block is never written to: the slices handed out are views
        if type(block) is np.ndarray:
            return block[start:end], [], {}
        return tree.map_structure(lambda leaf: leaf[start:end], block), [], {}


def _block_rows(space: gym.Space) -> int:
    """Rows of ``space`` drawn at once by ``RandomPolicy`` (0 for a space that is not made
    of arrays: sampled per call)."""
    row_bytes = _row_bytes(space)
    if row_bytes is None:
        return 0
    return max(1, min(MAX_BLOCK_ROWS, BLOCK_BYTES // max(row_bytes, 1)))


def _row_bytes(space: gym.Space) -> int | None:
    """Bytes of one sample of ``space`` as arrays (None: not an array space)."""
    spaces = gym.spaces
    if isinstance(space, spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary | spaces.Box):
        shape: tuple[int, ...] = space.shape or ()
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(space.dtype).itemsize
    if isinstance(space, spaces.Tuple | spaces.Dict):
        subs = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        total = 0
        for sub in subs:
            part = _row_bytes(sub)
            if part is None:
                return None
            total += part
        return total
    return None
