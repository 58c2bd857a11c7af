"""FlattenObservations: any observation space to one flat float32 vector per row."""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlconnect.connectors.base import ObservationConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import flatten_space
from rlconnect.spaces.flatten import Flattener, make_flattener

__all__ = ["FlattenObservations"]


@register_connector("FlattenObservations")
class FlattenObservations(ObservationConnector):
    """Maps ``obs`` of any space to ``(B, flat_dim)`` float32.

    Box and MultiBinary parts are reshaped and cast; Discrete and MultiDiscrete parts become
    one-hot vectors; Tuple and Dict parts are concatenated in the space's order. Output
    space: ``spaces.flatten_space(input_space)``, a float32 Box (one-hot parts in [0, 1]).
    """

    _flatten: Flattener | None = None  # planned once per bound input space, in setup

    def output_space(self, input_space: gym.Space) -> gym.Space:
        try:
            return flatten_space(input_space)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def setup(self, input_space: gym.Space) -> None:
        self._flatten = make_flattener(input_space)

    def transform(self, value: Any) -> np.ndarray:
        if self._flatten is None:
            self.input_space  # noqa: B018  (binds a standalone connector: setup plans)
        return cast("Flattener", self._flatten)(value)
