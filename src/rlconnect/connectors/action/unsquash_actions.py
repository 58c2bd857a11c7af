"""UnsquashActions: policy outputs in [-1, 1] mapped onto the Box bounds of the action space."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.connectors.base import ColumnActionConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import unsquash
from rlconnect.spaces.box import TensorBounds, unsquash_tensor

__all__ = ["UnsquashActions"]


@register_connector("UnsquashActions")
class UnsquashActions(ColumnActionConnector):
    """Clips ``actions`` to [-1, 1], then maps them linearly onto the Box bounds.

    ``-1`` becomes ``low`` and ``1`` becomes ``high``, so outputs always lie inside the
    bounds; dimensions with an infinite bound keep the clipped value. Output space: the
    Box itself. Identity for any non-Box space. On torch tensors it computes in float64
    as numpy does (float32 on ``mps``), with the bounds as tensors on the actions' device.
    """

    takes_tensors = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._bounds: TensorBounds = {}

    def transform(self, value: Any) -> Any:
        """Actions in [-1, 1] mapped onto the bound Box; non-Box actions pass unchanged."""
        space = self.input_space  # bound by the pipeline, else the context's action space
        if not isinstance(space, gym.spaces.Box):
            return value
        return unsquash(space, value)

    def transform_tensor(self, value: Any) -> Any:
        """The same mapping on torch tensors, with the bounds kept on the actions' device."""
        space = self.input_space
        if not isinstance(space, gym.spaces.Box):
            return value
        return unsquash_tensor(space, value, self._bounds)
