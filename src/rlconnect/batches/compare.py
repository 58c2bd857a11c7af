"""Value equality for batch columns: NaN equals NaN, object rows (infos) compare by `==`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches.tensors import leaf_to_numpy

if TYPE_CHECKING:
    from rlconnect.batches.sample_batch import SampleBatch


def _values_equal(x: Any, y: Any) -> bool:
    """`==` on arbitrary objects (infos), treating NaN as equal to NaN."""
    if x is y:
        return True
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return _leaves_equal(np.asarray(x), np.asarray(y))
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        return x.keys() == y.keys() and all(_values_equal(x[k], y[k]) for k in x)
    try:
        return bool(x == y)
    except (ValueError, TypeError):
        return False


def _leaves_equal(x: Any, y: Any) -> bool:
    """Same dtype, shape and values; a torch tensor compares as its numpy array."""
    x, y = leaf_to_numpy(x), leaf_to_numpy(y)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.dtype == object:
        return all(_values_equal(u, v) for u, v in zip(x.ravel(), y.ravel()))
    nan_ok = x.dtype.kind in "fc"
    return bool(np.array_equal(x, y, equal_nan=nan_ok))


def _sample_batches_equal(a: SampleBatch, b: SampleBatch) -> bool:
    """`batches_equal` for two SampleBatches: same rows, columns, nests, dtypes and values."""
    if len(a) != len(b) or set(a.keys()) != set(b.keys()):
        return False
    for key in a:
        try:
            tree.assert_same_structure(a[key], b[key], check_types=True)
        except (ValueError, TypeError):
            return False
        if not all(map(_leaves_equal, tree.flatten(a[key]), tree.flatten(b[key]))):
            return False
    return True
