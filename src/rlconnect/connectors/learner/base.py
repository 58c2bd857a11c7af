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

import sys
from typing import TYPE_CHECKING, ClassVar

from rlconnect.connectors.base import Connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["LearnerConnector", "on_tensors"]


class LearnerConnector(Connector):
    """Base of learner connectors: override ``__call__`` (and ``check_policy`` when the
    connector needs something of the policy, such as values or log-probabilities).

    ``__call__(batch, policy)`` gets one policy's ``SampleBatch`` and the policy that
    collected it (as it is now) and returns the batch with its new columns. Compute every
    output first and assign them at the end, so that an error leaves the batch unchanged.

    ``takes_tensors`` declares that ``__call__`` also takes a batch whose columns are torch
    tensors on one device (the tensor path, API section 14) and keeps them there; a runner
    on that path refuses, when it is built, a pipeline with a member that does not.
    """

    takes_tensors: ClassVar[bool] = False

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Return ``batch`` with this connector's columns added, computed with ``policy``."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(batch, policy)")

    def check_policy(self, policy: Policy) -> None:
        """Raise ValueError naming this connector, what it needs and the fix if ``policy``
        cannot provide it (a runner calls this when it is built, not mid-run)."""


def on_tensors(batch: SampleBatch, *names: str) -> bool:
    """True when the first of the columns ``names`` that ``batch`` has is a torch tensor:
    the batch is on the tensor path (torch is not imported to find out)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    for name in names:
        if name in batch:
            return isinstance(batch[name], torch.Tensor)
    return False
