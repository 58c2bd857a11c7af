"""ClipReward: rewards reduced to their sign, or clipped to [-limit, limit]."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from rlconnect.connectors.base import RewardConnector
from rlconnect.connectors.registry import register_connector

__all__ = ["ClipReward"]


@register_connector("ClipReward")
class ClipReward(RewardConnector):
    """Maps the ``rewards`` column: ``np.sign`` when ``limit`` is None, else clip to ±limit.

    A batch without a ``rewards`` column (e.g. built by hand) passes through unchanged.
    The runner always sends one; a row that starts an agent's trajectory carries reward 0
    (it belongs to no transition), so reward statistics should skip those rows.

    Works on torch tensors too (``torch.sign`` / ``torch.clamp``, same dtype).

    Args:
        limit: None for the sign of the reward (-1, 0 or 1), or a positive number.
    """

    takes_tensors = True

    def __init__(self, ctx: Any, limit: float | None = None) -> None:
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0
        ):
            raise ValueError(f"ClipReward: limit must be None or a positive number, got {limit!r}")
        super().__init__(ctx, limit=None if limit is None else float(limit))
        self.limit = None if limit is None else float(limit)

    def transform(self, value: Any) -> np.ndarray:
        """Rewards as their sign, or clipped to ``[-limit, limit]``."""
        rewards = np.asarray(value)
        if self.limit is None:
            return np.sign(rewards)
        return np.clip(rewards, -self.limit, self.limit)

    def transform_tensor(self, value: Any) -> Any:
        """The same on a torch tensor (``sign`` or ``clamp``), on its device."""
        if self.limit is None:
            return value.sign()
        return value.clamp(-self.limit, self.limit)
