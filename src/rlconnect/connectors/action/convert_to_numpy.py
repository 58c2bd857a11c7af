"""ConvertToNumpy: torch tensors in any column (nests included) become numpy arrays."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import tree

from rlconnect.connectors.base import ActionConnector, ActionData
from rlconnect.connectors.registry import register_connector

__all__ = ["ConvertToNumpy", "to_numpy"]


def _leaf_to_numpy(leaf: Any) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(leaf, torch.Tensor):
        return leaf.detach().cpu().numpy()
    return leaf


def to_numpy(value: Any) -> Any:
    """``value`` with every torch tensor (at any depth of a dict/tuple nest) as numpy.

    torch is never imported here: if it is not loaded, there can be no tensors.
    """
    if isinstance(value, np.ndarray) or "torch" not in sys.modules:
        return value
    return tree.map_structure(_leaf_to_numpy, value)


@register_connector("ConvertToNumpy")
class ConvertToNumpy(ActionConnector):
    """Turns torch tensors in every column (``actions``, ``state_out_*``, extras) into numpy.

    Tensors are detached and moved to the CPU; numpy arrays and other values pass through.
    It takes tensors (that is its job) but reads them on the host: default pipelines built
    for the tensor path (``ctx.device`` set) leave it out, since the env takes tensors.
    """

    takes_tensors = True

    def __call__(self, data: ActionData) -> ActionData:
        """Every torch column as numpy; nothing to do (and torch not imported) when torch
        was never loaded."""
        if "torch" not in sys.modules:
            return data
        for name, value in list(data.columns.items()):
            if not isinstance(value, np.ndarray):
                data.columns[name] = to_numpy(value)
        return data
