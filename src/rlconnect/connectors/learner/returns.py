"""DiscountedReturns: the discounted sum of the rest of each trajectory's rewards."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlconnect.connectors.base import ConnectorContext
from rlconnect.connectors.learner.base import LearnerConnector, on_tensors
from rlconnect.connectors.learner.params import check_fraction
from rlconnect.connectors.learner.scan import discounted_suffix_sum
from rlconnect.connectors.learner.trajectories import find_trajectories
from rlconnect.connectors.learner.values import (
    check_finite,
    float_column,
    new_columns,
    require_values,
    values_and_bootstrap,
)
from rlconnect.connectors.registry import register_connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["DiscountedReturns"]


@register_connector("DiscountedReturns")
class DiscountedReturns(LearnerConnector):
    """Adds ``returns`` (float32): ``sum_i gamma**i * rewards[t+i]`` over the rest of the
    row's trajectory, plus ``gamma**(T-t) * V`` after its last row: 0 after a termination,
    the value of the last row's ``new_obs`` (one ``compute_values`` call for the batch)
    after a truncation or a cut.

    Args:
        gamma: discount per row of a trajectory, in [0, 1].
    """

    takes_tensors: ClassVar[bool] = True

    def __init__(self, ctx: ConnectorContext, gamma: float = 0.99):
        self.gamma = check_fraction("DiscountedReturns", "gamma", gamma)
        super().__init__(ctx, gamma=self.gamma)

    def check_policy(self, policy: Policy) -> None:
        """ValueError unless ``policy`` has ``compute_values`` (for the bootstrap values)."""
        require_values(policy, self.name)

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Add ``returns``; ValueError naming a missing, malformed or non-finite column."""
        if on_tensors(batch, "eps_id", "rewards"):
            from rlconnect.connectors.learner.torch_connectors import returns_on_tensors

            return returns_on_tensors(self, batch, policy)
        who = self.name
        new_columns(batch, ("returns",), who)
        traj = find_trajectories(batch, who)
        rewards = float_column(batch, "rewards", who)
        _, after_last = values_and_bootstrap(batch, policy, traj, rows_too=False, who=who)
        returns = discounted_suffix_sum(
            rewards, traj.last_rows, self.gamma, after=after_last, dtype=np.float32
        )
        check_finite(returns, "the return", who)
        batch["returns"] = returns
        return batch
