"""NStepReturns: n-step reward sums and where each n-step target bootstraps."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import tree

from rlconnect.batches.columns import NEXT_INPUTS_OF
from rlconnect.connectors.base import ConnectorContext
from rlconnect.connectors.learner.base import LearnerConnector, on_tensors
from rlconnect.connectors.learner.params import check_fraction, check_steps
from rlconnect.connectors.learner.scan import discounted_window_sum
from rlconnect.connectors.learner.trajectories import find_trajectories
from rlconnect.connectors.learner.values import (
    as_float32,
    check_finite,
    float_column,
    new_columns,
)
from rlconnect.connectors.registry import register_connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["NStepReturns", "n_step_carried"]


def n_step_carried(batch: SampleBatch, policy: Policy, who: str) -> list[str]:
    """The columns whose row ``t+k-1`` an n-step target also needs besides ``new_obs``:
    ``state_out_*`` of a recurrent policy, and ``new_prev_actions`` / ``new_prev_rewards``
    when the batch has ``prev_actions`` / ``prev_rewards`` (the policy's other inputs at
    the bootstrap step). ValueError naming what is missing."""
    carried = [f"state_out_{i}" for i in range(policy.num_state_tensors())]
    carried += [nxt for prev, nxt in NEXT_INPUTS_OF.items() if prev in batch]
    missing = [c for c in ("new_obs", *carried) if c not in batch]
    if missing:
        raise ValueError(f"{who} needs columns {missing}; the batch has {sorted(batch)}")
    return carried


@register_connector("NStepReturns")
class NStepReturns(LearnerConnector):
    """Adds n-step targets: for row ``t`` of a trajectory of ``T`` rows, ``k = min(n, T - t)``.

    - ``n_step_rewards`` (float32): ``sum_{i<k} gamma**i * rewards[t+i]``;
    - ``n_step_new_obs``: ``new_obs[t+k-1]``, the same structure as ``new_obs``;
    - ``n_step_discount`` (float32): 0.0 when row ``t+k-1`` ends its trajectory by
      termination, else ``gamma**k``;
    - for a recurrent policy, ``n_step_state_out_i``: ``state_out_i[t+k-1]``;
    - when the batch has ``prev_actions`` / ``prev_rewards``: ``n_step_new_prev_actions``
      / ``n_step_new_prev_rewards``, ``new_prev_*[t+k-1]`` (what the policy is fed there).

    A learner's target is ``n_step_rewards + n_step_discount * V(n_step_new_obs)``
    (from ``n_step_state_out_*`` and ``n_step_new_prev_*``). No policy call.

    Args:
        n: the number of steps, an int >= 1.
        gamma: discount per row of a trajectory, in [0, 1].
    """

    takes_tensors: ClassVar[bool] = True

    def __init__(self, ctx: ConnectorContext, n: int = 3, gamma: float = 0.99):
        self.n = check_steps("NStepReturns", "n", n)
        self.gamma = check_fraction("NStepReturns", "gamma", gamma)
        super().__init__(ctx, n=self.n, gamma=self.gamma)

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Add the ``n_step_*`` columns; ``policy`` only says how many state tensors to
        carry (it is not called)."""
        if on_tensors(batch, "eps_id", "rewards"):
            from rlconnect.connectors.learner.torch_connectors import n_step_on_tensors

            return n_step_on_tensors(self, batch, policy)
        who = self.name
        carried = n_step_carried(batch, policy, who)
        outputs = ("n_step_rewards", "n_step_new_obs", "n_step_discount")
        new_columns(batch, (*outputs, *(f"n_step_{c}" for c in carried)), who)
        traj = find_trajectories(batch, who)
        rewards = float_column(batch, "rewards", who)
        rem = traj.rem()
        sums = discounted_window_sum(rewards, traj.last_rows, self.gamma, self.n)
        check_finite(sums, "the n-step reward sum", who)
        sums32 = as_float32(sums, "the n-step reward sum (column 'n_step_rewards')", who)
        k_minus_1 = np.minimum(rem, self.n - 1)
        last = np.arange(len(batch)) + k_minus_1
        discount = np.power(self.gamma, k_minus_1 + 1.0)
        discount[traj.terminating_rows()[last]] = 0.0
        out = {
            "n_step_rewards": sums32,
            "n_step_new_obs": tree.map_structure(lambda x: x[last], batch["new_obs"]),
            "n_step_discount": discount.astype(np.float32),
            **{f"n_step_{c}": batch[c][last] for c in carried},
        }
        batch.update(out)
        return batch
