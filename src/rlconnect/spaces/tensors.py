"""Spaces on the tensor path: torch dtypes, and `flatten_batch` for batches of torch tensors.

torch is imported only inside these functions (``import rlconnect`` never imports it).
`TensorFlattener` flattens on the batch's device without a host read.

The numpy `Flattener` raises on an index outside a Discrete/MultiDiscrete range; that check
needs the values on the host. Here every one-hot part is one comparison of the gathered
indices with the value each output column stands for, so an index out of range gives a row
with no 1 in that part, and ``__call__`` also returns which rows were out of range, for
the caller to report later (``FlattenObservations`` defers it to the runner's check).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tree
from gymnasium import spaces as gs

from rlconnect.spaces._common import _leaf_shape, _skeleton
from rlconnect.spaces.flatten import flat_dim

__all__ = ["TensorFlattener", "torch_dtype"]


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a numpy dtype (``np.float32`` -> ``torch.float32``)."""
    return _torch_dtype(np.dtype(dtype))


@functools.lru_cache(maxsize=64)
def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _one_hot_columns(space: gs.Discrete | gs.MultiDiscrete) -> tuple[np.ndarray, np.ndarray]:
    """``(component, value)`` of each one-hot column: column c is 1 where index
    ``component[c]`` of the row equals ``value[c]``."""
    sizes = np.asarray(space.nvec if isinstance(space, gs.MultiDiscrete) else [space.n]).ravel()
    start = np.broadcast_to(np.asarray(space.start, np.int64).reshape(-1), sizes.shape)
    component = np.repeat(np.arange(len(sizes)), sizes.astype(np.int64))
    value = np.concatenate([s + np.arange(n, dtype=np.int64) for s, n in zip(start, sizes)])
    return component, value


class TensorFlattener:
    """``TensorFlattener(space)(batch) -> (flat, out_of_range)`` for a nest of torch tensors:
    ``flat`` is ``(B, flat_dim)`` float32 on the batch's device, in `flatten_batch`'s
    layout; ``out_of_range`` a bool ``(B,)`` tensor (rows with a Discrete/MultiDiscrete index
    outside its range, whose one-hot part is then all zeros)."""

    def __init__(self, space: gs.Space) -> None:
        skel = _skeleton(space)  # TypeError for unsupported spaces
        self.space = space
        self.dim = flat_dim(space)
        self._leaves: list[tuple[tuple, gs.Space]] = list(tree.flatten_with_path(skel))
        self._tables: dict[Any, list[Any]] = {}  # per device: one-hot (component, value)

    def _tables_on(self, device: Any) -> list[Any]:
        tables = self._tables.get(device)
        if tables is None:
            import torch

            tables = []
            for _, sp in self._leaves:
                if isinstance(sp, gs.Discrete | gs.MultiDiscrete):
                    comp, value = _one_hot_columns(sp)
                    as_t = torch.as_tensor
                    k = int(comp[-1]) + 1 if len(comp) else 0  # indices per row
                    tables.append((as_t(comp, device=device), as_t(value, device=device), k))
                else:
                    tables.append(None)
            self._tables[device] = tables
        return tables

    def __call__(self, batch: Any) -> tuple[Any, Any]:
        """``(flat, out_of_range)``: the nest flattened to float32 on its device, and a 0-d
        bool tensor, True when a Discrete index was out of range (None: none can be)."""
        import torch

        parts, bad = [], None
        first = _get(batch, self._leaves[0][0]) if self._leaves else None
        if first is None:
            raise ValueError(f"cannot flatten a batch of {self.space}: it has no parts")
        n, device = first.shape[0], first.device
        for (path, sp), table in zip(self._leaves, self._tables_on(device)):
            x = _get(batch, path)
            if tuple(x.shape) != (n, *_leaf_shape(sp)):
                raise ValueError(
                    f"{sp} part {list(path)}: expected shape {(n, *_leaf_shape(sp))}, "
                    f"got {tuple(x.shape)}"
                )
            if table is None:
                parts.append(x.reshape(n, -1).to(torch.float32))
                continue
            comp, value, k = table
            hot = x.reshape(n, -1).to(torch.int64)[:, comp] == value
            miss = hot.sum(dim=1) != k
            bad = miss if bad is None else bad | miss
            parts.append(hot.to(torch.float32))
        flat = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        if bad is None:
            bad = torch.zeros(n, dtype=torch.bool, device=device)
        return flat, bad


def _get(batch: Any, path: tuple) -> Any:
    for key in path:
        batch = batch[key]
    return batch
