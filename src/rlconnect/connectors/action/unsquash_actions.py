"""UnsquashActions: policy outputs in [-1, 1] mapped onto the Box bounds of the action space."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.connectors.base import ColumnActionConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import unsquash

__all__ = ["UnsquashActions"]


@register_connector("UnsquashActions")
class UnsquashActions(ColumnActionConnector):
    """Clips ``actions`` to [-1, 1], then maps them linearly onto the Box bounds.

    ``-1`` becomes ``low`` and ``1`` becomes ``high``, so outputs always lie inside the
    bounds; dimensions with an infinite bound keep the clipped value. Output space: the
    Box itself. Identity for any non-Box space.
    """

    def transform(self, value: Any) -> Any:
        space = self.input_space  # bound by the pipeline, else the context's action space
        if not isinstance(space, gym.spaces.Box):
            return value
        return unsquash(space, value)
