"""A user-defined stateful connector, imported by name in a fresh process by test_saving."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.connectors.base import ObservationConnector
from rlconnect.connectors.registry import register_connector


@register_connector("SavingTestRunningMax")
class RunningMax(ObservationConnector):
    """Divides observations by the running max of their absolute values (per feature)."""

    def __init__(self, ctx: Any, eps: float = 1e-3) -> None:
        super().__init__(ctx, eps=eps)
        self.max_abs = np.full(ctx.observation_space.shape, eps, dtype=np.float32)
        self.steps = 0

    def transform(self, obs: np.ndarray) -> np.ndarray:
        if self.is_training:
            self.max_abs = np.maximum(self.max_abs, np.abs(obs).max(axis=0))
            self.steps += len(obs)
        return (obs / self.max_abs).astype(np.float32)

    def get_statistics(self) -> dict[str, Any]:
        return {"max_abs": self.max_abs.copy(), "steps": self.steps}

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        max_abs = np.asarray(stats["max_abs"])
        if max_abs.shape != self.max_abs.shape or max_abs.dtype != np.float32:
            raise ValueError(f"max_abs must be float32 {self.max_abs.shape}, got {max_abs.dtype}")
        self.max_abs = max_abs.copy()
        self.steps = int(stats["steps"])
