"""VTrace: off-policy value targets and policy-gradient advantages (Espeholt et al., 2018)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from rlconnect.connectors.base import ConnectorContext
from rlconnect.connectors.learner.base import LearnerConnector, on_tensors
from rlconnect.connectors.learner.params import check_fraction, check_positive
from rlconnect.connectors.learner.scan import linear_suffix_scan
from rlconnect.connectors.learner.trajectories import find_trajectories
from rlconnect.connectors.learner.values import (
    check_finite,
    float_column,
    new_columns,
    next_values,
    policy_inputs,
    require_log_likelihoods,
    require_values,
    values_and_bootstrap,
)
from rlconnect.connectors.registry import register_connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["VTrace"]


@register_connector("VTrace")
class VTrace(LearnerConnector):
    """Adds ``vtrace_targets`` (v_s) and ``pg_advantages`` (float32) for rows acted by
    older weights (a behaviour policy) to train ``policy`` as it is now (the target).

    With ``rho_s = exp(target_logp_s - action_logp_s)`` (the target's log-probability of
    the recorded ``actions``, from its own distribution over ``action_dist_inputs``
    recomputed from ``obs`` and ``state_in_*``; the batch's ``action_logp``), values
    ``V`` from the current policy's ``compute_values`` and ``V`` after a trajectory's last
    row bootstrapped as for ``GAE`` (one call for rows and bootstraps)::

        delta_s = min(clip_rho, rho_s) * (r_s + gamma * V(x_{s+1}) - V(x_s))
        v_s = V(x_s) + delta_s + gamma * min(clip_c, rho_s) * (v_{s+1} - V(x_{s+1}))
        pg_advantages_s = min(clip_pg_rho, rho_s) * (r_s + gamma * v_{s+1} - V(x_s))

    where ``v`` after the last row is the bootstrap value.

    Args:
        gamma: discount per row of a trajectory, in [0, 1].
        clip_rho: the truncation of the importance weights in ``delta`` (rho-bar), > 0.
        clip_c: the truncation of the trace coefficients (c-bar), > 0.
        clip_pg_rho: the truncation of the weights of ``pg_advantages``, > 0.
    """

    takes_tensors: ClassVar[bool] = True

    def __init__(
        self,
        ctx: ConnectorContext,
        gamma: float = 0.99,
        clip_rho: float = 1.0,
        clip_c: float = 1.0,
        clip_pg_rho: float = 1.0,
    ):
        self.gamma = check_fraction("VTrace", "gamma", gamma)
        self.clip_rho = check_positive("VTrace", "clip_rho", clip_rho)
        self.clip_c = check_positive("VTrace", "clip_c", clip_c)
        self.clip_pg_rho = check_positive("VTrace", "clip_pg_rho", clip_pg_rho)
        super().__init__(
            ctx,
            gamma=self.gamma,
            clip_rho=self.clip_rho,
            clip_c=self.clip_c,
            clip_pg_rho=self.clip_pg_rho,
        )

    def check_policy(self, policy: Policy) -> None:
        """ValueError unless ``policy`` has ``compute_values`` and gives log-likelihoods of
        recorded actions (for the importance weights)."""
        require_values(policy, self.name)
        require_log_likelihoods(policy, self.name)

    def _rho(self, batch: SampleBatch, policy: Policy) -> np.ndarray:
        """Importance weights exp(target logp - behaviour logp) of the recorded actions."""
        who = self.name
        behaviour = float_column(batch, "action_logp", who)
        if "actions" not in batch:
            raise ValueError(f"{who} needs an 'actions' column; the batch has {sorted(batch)}")
        inputs = policy_inputs(batch, policy, None, after=False, who=who)
        target = np.asarray(
            policy.compute_log_likelihoods(inputs, batch["actions"]), dtype=np.float64
        )
        check_finite(target, "the policy's log-probability of the recorded action", who)
        return np.exp(target - behaviour)

    def _columns(
        self,
        rewards: np.ndarray,
        rho: np.ndarray,
        values: np.ndarray,
        last: np.ndarray,
        boot: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(v_s, pg_advantages)`` in float64, ``last`` being the trajectories' last rows
        and ``boot`` the values after them."""
        delta = next_values(values, last, boot)
        delta *= self.gamma
        delta += rewards
        delta -= values
        delta *= np.minimum(self.clip_rho, rho)
        coef = np.minimum(self.clip_c, rho)
        coef *= self.gamma
        targets = linear_suffix_scan(delta, coef, last)
        targets += values
        advantages = next_values(targets, last, boot)
        advantages *= self.gamma
        advantages += rewards
        advantages -= values
        advantages *= np.minimum(self.clip_pg_rho, rho)
        return targets, advantages

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Add ``vtrace_targets`` and ``pg_advantages``; ValueError naming a missing,
        malformed or non-finite column (``actions``, ``action_logp``, ``rewards``, ...)."""
        if on_tensors(batch, "eps_id", "rewards"):
            from rlconnect.connectors.learner.torch_connectors import vtrace_on_tensors

            return vtrace_on_tensors(self, batch, policy)
        who = self.name
        new_columns(batch, ("vtrace_targets", "pg_advantages"), who)
        traj = find_trajectories(batch, who)
        rewards = float_column(batch, "rewards", who)
        if len(batch) == 0:  # nothing to weigh; no policy call (torch models refuse 0 rows)
            float_column(batch, "action_logp", who)
            empty = np.zeros(0, np.float32)
            batch.update({"vtrace_targets": empty, "pg_advantages": empty.copy()})
            return batch
        rho = self._rho(batch, policy)
        values, after_last = values_and_bootstrap(batch, policy, traj, rows_too=True, who=who)
        targets, advantages = self._columns(
            rewards, rho, cast(np.ndarray, values), traj.last_rows, after_last
        )
        out = {
            "vtrace_targets": targets.astype(np.float32),
            "pg_advantages": advantages.astype(np.float32),
        }
        check_finite(out["pg_advantages"], "the V-trace advantage", who)
        check_finite(out["vtrace_targets"], "the V-trace target", who)
        batch.update(out)
        return batch
