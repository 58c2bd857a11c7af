"""ClipActions: actions clipped into the Box bounds of the action space."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.connectors.base import ColumnActionConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import clip_to_space
from rlconnect.spaces.box import TensorBounds, clip_to_space_tensor

__all__ = ["ClipActions"]


@register_connector("ClipActions")
class ClipActions(ColumnActionConnector):
    """Clips ``actions`` into the bounds of the bound Box space, cast to its dtype.

    Identity for any other space (Discrete, MultiDiscrete, Tuple, Dict...). Integer Boxes
    round to the nearest integer first. On torch tensors the bounds are tensors on the
    actions' device (built once per device).
    """

    takes_tensors = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._bounds: TensorBounds = {}

    def transform(self, value: Any) -> Any:
        """Actions clipped into the bound Box's bounds; non-Box actions pass unchanged."""
        space = self.input_space  # bound by the pipeline, else the context's action space
        if not isinstance(space, gym.spaces.Box):
            return value
        return clip_to_space(space, value)

    def transform_tensor(self, value: Any) -> Any:
        """The same clip on torch tensors, with the bounds kept on the actions' device."""
        space = self.input_space
        if not isinstance(space, gym.spaces.Box):
            return value
        return clip_to_space_tensor(space, value, self._bounds)
