"""GAE: generalised advantage estimation over every trajectory of a batch at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from rlconnect.connectors.base import ConnectorContext
from rlconnect.connectors.learner.base import LearnerConnector, on_tensors
from rlconnect.connectors.learner.params import check_fraction
from rlconnect.connectors.learner.scan import gae_columns
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

__all__ = ["GAE"]


@register_connector("GAE")
class GAE(LearnerConnector):
    """Adds ``advantages`` and ``value_targets`` (``advantages + vf_preds``), float32.

    ``delta[t] = rewards[t] + gamma * V[t+1] - vf_preds[t]`` and ``advantages[t] =
    sum_i (gamma * lambda_)**i * delta[t+i]`` over the rest of the row's trajectory, where
    ``V`` after a trajectory's last row is 0 for a termination and the value of that row's
    ``new_obs`` (and ``state_out_*``) for a truncation or a cut. ``vf_preds`` is computed with
    ``policy.compute_values`` and added when the batch has none; it and every bootstrap
    value come from one call.

    Args:
        gamma: discount per row of a trajectory, in [0, 1].
        lambda_: GAE's bias/variance trade-off, in [0, 1] (1: Monte-Carlo advantages).
    """

    takes_tensors: ClassVar[bool] = True

    def __init__(self, ctx: ConnectorContext, gamma: float = 0.99, lambda_: float = 0.95):
        self.gamma = check_fraction("GAE", "gamma", gamma)
        self.lambda_ = check_fraction("GAE", "lambda_", lambda_)
        super().__init__(ctx, gamma=self.gamma, lambda_=self.lambda_)

    def check_policy(self, policy: Policy) -> None:
        """ValueError unless ``policy`` has ``compute_values`` (for ``vf_preds`` and
        the bootstrap values)."""
        require_values(policy, self.name)

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Add ``advantages`` and ``value_targets`` (and ``vf_preds`` when missing);
        ValueError naming a missing, malformed or non-finite column."""
        if on_tensors(batch, "eps_id", "rewards"):
            from rlconnect.connectors.learner.torch_connectors import gae_on_tensors

            return gae_on_tensors(self, batch, policy)
        who = self.name
        has_vf = "vf_preds" in batch
        new_columns(batch, ("advantages", "value_targets", *(() if has_vf else ("vf_preds",))), who)
        traj = find_trajectories(batch, who)
        rewards = float_column(batch, "rewards", who, finite=False)  # checked below
        values = float_column(batch, "vf_preds", who, finite=False) if has_vf else None
        row_values, after_last = values_and_bootstrap(
            batch, policy, traj, rows_too=values is None, who=who
        )
        if values is None:
            values = cast(np.ndarray, row_values)  # asked for with rows_too
        adv, targets = gae_columns(  # a non-finite input shows in the targets: see below
            rewards, values, traj.last_rows, after_last, self.gamma, self.lambda_
        )
        out = {"advantages": adv, "value_targets": targets}
        if not np.isfinite(np.sum(targets)):  # every reward and value reaches a target:
            check_finite(rewards, "column 'rewards'", who)  # name a bad one first
            check_finite(values, "column 'vf_preds'", who)
            check_finite(targets, "the value target", who)
        if not has_vf:
            out["vf_preds"] = values.astype(np.float32)
        batch.update(out)
        return batch
