"""Batch columns as torch tensors and back: what `SampleBatch.to` and `.numpy` do.

A column leaf is a numpy array or a torch tensor (the tensor path). torch is imported
only when a conversion to tensors is asked for; a leaf is recognised as a tensor without
importing torch (if torch is not imported, no tensor can exist).

From numpy to CPU tensors no data is copied where torch allows it (`torch.from_numpy`
shares the array's memory). Three kinds of array are copied first: read-only arrays (a
tensor would let the learner write into memory numpy promised not to change), arrays of
non-native byte order and arrays with negative strides, which torch cannot wrap. Leaves
torch has no dtype for (object arrays such as ``infos``, strings) are left out: a batch
converted with ``to()`` has no such column.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches.lazy import LazyColumn

if TYPE_CHECKING:
    import torch

__all__ = ["column_device", "is_tensor", "leaf_to_numpy", "leaf_to_tensor", "tensor_kind"]

#: numpy dtype kinds torch has tensors for: bool, signed / unsigned int, float, complex
_TORCH_KINDS = frozenset("biufc")


def is_tensor(value: Any) -> bool:
    """True for a torch tensor (torch is not imported for the check)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_kind(leaf: Any) -> bool:
    """True if `leaf_to_tensor` converts ``leaf`` (a tensor, or an array of a dtype torch has)."""
    if is_tensor(leaf):
        return True
    dtype = getattr(leaf, "dtype", None)
    return isinstance(dtype, np.dtype) and dtype.kind in _TORCH_KINDS


def leaf_to_tensor(leaf: Any, device: torch.device | str | None) -> torch.Tensor:
    """``leaf`` as a tensor on ``device`` (None: a tensor stays where it is, an array goes
    to the CPU), sharing memory with a CPU array where torch allows it."""
    import torch

    if isinstance(leaf, torch.Tensor):
        return leaf if device is None else leaf.to(device)
    if isinstance(leaf, LazyColumn):
        leaf = leaf.materialize()
    arr = np.asarray(leaf)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    elif not arr.flags.writeable or any(s < 0 for s in arr.strides):
        arr = np.array(arr)  # a writable, positive-stride copy
    out = torch.from_numpy(arr)
    return out if device is None else out.to(device)


def leaf_to_numpy(leaf: Any) -> Any:
    """A tensor leaf as a numpy array (a CPU tensor's memory is shared); others unchanged."""
    if is_tensor(leaf):
        return leaf.detach().cpu().numpy()
    return leaf


def column_device(column: Any) -> torch.device | None:
    """The device of the first tensor leaf of ``column``, or None when it has none."""
    if is_tensor(column):
        return column.device
    if isinstance(column, np.ndarray):
        return None
    for leaf in tree.flatten(column):
        if is_tensor(leaf):
            return leaf.device
    return None
