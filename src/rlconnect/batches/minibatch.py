"""Minibatches for a learner's epochs: what `SampleBatch.minibatches` and
`SampleBatch.sequence_minibatches` yield.

Each minibatch is gathered (``np.take`` / ``index_select``) into arrays of its own, so
writing into one (``NormalizeAdvantages`` on it, ``mb["advantages"] -= m``) never changes
the batch it came from or another minibatch; rows of object columns (``infos``) are deep
copies for the same reason. The row order comes from one permutation per epoch: numpy's
``default_rng(seed)`` for a numpy batch, ``torch.randperm`` with a seeded generator on the
batch's device for a tensor batch, so the same seed gives the same minibatches.

>>> import numpy as np
>>> from rlconnect.batches import SampleBatch
>>> b = SampleBatch({"obs": np.arange(10.0), "eps_id": np.zeros(10, np.int64)})
>>> [len(mb) for mb in b.minibatches(4, seed=0)]
[4, 4, 2]
>>> [mb["obs"].tolist() for mb in b.minibatches(5, shuffle=False)]
[[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches.lazy import LazyColumn
from rlconnect.batches.take import take_rows
from rlconnect.batches.tensors import is_tensor, leaf_to_numpy

if TYPE_CHECKING:
    import torch

__all__ = ["check_count", "gather_owned", "minibatch_indices", "own_objects"]


def check_count(value: Any, name: str, *, at_most: int | None = None, what: str = "") -> int:
    """``value`` as an int >= 1 (and <= ``at_most``), or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if at_most is not None and value > at_most:
        raise ValueError(
            f"{name}={value} is larger than the {at_most} {what} there are; "
            f"pass a {name} of at most {at_most}"
        )
    return int(value)


def minibatch_indices(
    n: int,
    size: int,
    *,
    shuffle: bool,
    seed: int | None,
    epochs: int,
    drop_last: bool,
    device: torch.device | None = None,
) -> Iterator[Any]:
    """Row indices of each minibatch, epoch after epoch: numpy arrays, or int64 tensors on
    ``device`` when it is given. ``drop_last`` leaves out each epoch's short last one."""
    stop = n - n % size if drop_last else n
    if device is None:
        rng = np.random.default_rng(seed)
        for _ in range(epochs):
            order = rng.permutation(n) if shuffle else np.arange(n)
            for start in range(0, stop, size):
                yield order[start : start + size]
        return
    import torch

    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    for _ in range(epochs):
        if shuffle:
            perm = torch.randperm(n, generator=generator, device=device)
        else:
            perm = torch.arange(n, device=device)
        for start in range(0, stop, size):
            yield perm[start : start + size]


def own_objects(column: Any) -> Any:
    """``column`` with its object leaves (gathered, so already new arrays) deep-copied, so
    that the Python objects in them (``infos`` dicts) belong to this column alone."""
    if isinstance(column, np.ndarray):
        return copy.deepcopy(column) if column.dtype == object else column

    def own(leaf: Any) -> Any:
        if is_tensor(leaf) or not isinstance(leaf, np.ndarray) or leaf.dtype != object:
            return leaf
        return copy.deepcopy(leaf)

    return tree.map_structure(own, column)


def gather_owned(column: Any, index: Any) -> Any:
    """The rows ``index`` of ``column`` in new arrays (object rows deep-copied): a plain
    tensor or array straight to ``index_select`` / ``np.take``, anything else (nests, lazy
    columns) through `take_rows`."""
    kind = type(column)
    if kind is np.ndarray:
        if is_tensor(index):
            index = leaf_to_numpy(index)
        if column.dtype == object:
            return copy.deepcopy(column[index])
        return np.take(column, index, axis=0) if column.ndim > 1 else column[index]
    if is_tensor(column) and is_tensor(index) and column.device == index.device:
        return column.index_select(0, index)
    if isinstance(column, LazyColumn):  # stays lazy (and read-only)
        return column.take(leaf_to_numpy(index))
    return own_objects(take_rows(column, index))
