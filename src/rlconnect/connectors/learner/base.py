"""The learner connector interface: a policy's batch in, the same batch with more columns out.

A learner connector turns what a runner collected into what a loss needs (returns,
advantages, bootstrap values, off-policy corrections)::

    batch = runner.sample()["default_policy"]        # one policy's SampleBatch
    batch = learner_pipeline(batch, policy)          # adds advantages, value_targets, ...

It works on whole batches: trajectories are the rows of one ``eps_id`` (and ``agent_index``)
wherever they sit (:mod:`rlconnect.connectors.learner.trajectories`), and everything is array
work over all rows at once. It adds columns and never changes the existing ones, and on bad
input it raises before writing anything. Like agent and action connectors it is built as
``Cls(ctx, **params)``, registered by name and saved as ``(name, params)``, never pickled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlconnect.connectors.base import Connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["LearnerConnector"]


class LearnerConnector(Connector):
    """Base of learner connectors: override ``__call__`` (and ``check_policy`` when the
    connector needs something of the policy, such as values or log-probabilities).

    ``__call__(batch, policy)`` gets one policy's ``SampleBatch`` and the policy that
    collected it (as it is now) and returns the batch with its new columns. Compute every
    output first and assign them at the end, so that an error leaves the batch unchanged.
    """

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(batch, policy)")

    def check_policy(self, policy: Policy) -> None:
        """Raise ValueError naming this connector, what it needs and the fix if ``policy``
        cannot provide it (a runner calls this when it is built, not mid-run)."""
