"""Small helpers of the tensor path shared by the connectors; torch is never imported here.

On the tensor path (``ConnectorContext.device`` set; docs/gpu.md) the columns of an
``AgentData`` / ``ActionData`` are torch tensors on one device. These helpers tell the two
paths apart without importing torch (if torch is not loaded, nothing can be a tensor) and
build the few constants (bounds, one-hot tables) a connector keeps per device.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.spaces.tensors import torch_dtype

__all__ = ["holds_tensors", "is_tensor", "numpy_of", "torch_dtype"]


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (False without importing torch when it is not loaded)."""
    if type(value) is np.ndarray:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def holds_tensors(value: Any) -> bool:
    """Whether a column (a leaf, or a dict/tuple nest of leaves) holds torch tensors: its
    first leaf is one. A numpy array answers at once, so the numpy path pays one check."""
    if type(value) is np.ndarray or "torch" not in sys.modules:
        return False
    while isinstance(value, Mapping | tuple | list) and len(value):
        value = next(iter(value.values())) if isinstance(value, Mapping) else value[0]
    return is_tensor(value)


def numpy_of(value: Any) -> Any:
    """A tensor as a numpy array (a host read: checkpoints and messages only); anything else
    as it is."""
    if is_tensor(value):
        return value.detach().cpu().numpy()
    return value
