"""LearnerConnectorPipeline: learner connectors in order, called like one of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlconnect.connectors.learner.base import LearnerConnector
from rlconnect.connectors.learner.torch_checks import check_scope
from rlconnect.connectors.pipeline import ConnectorPipeline

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["LearnerConnectorPipeline"]


class LearnerConnectorPipeline(ConnectorPipeline[LearnerConnector]):
    """Learner connectors in order; ``pipe(batch, policy)`` runs them like one connector.

    Edited, saved and timed like agent and action pipelines (``append``, ``insert_after``,
    ``remove``, ``to_state`` / ``from_state``, ``timings``). The members work on a shallow
    copy of the batch, which is returned: if one of them raises, the caller's batch has
    none of the columns the others added. An empty pipeline returns the batch itself.
    On a batch of torch tensors the members' checks are read once, after the last member
    (one host read per call; none inside ``deferred_checks()``, see :mod:`.torch_checks`).

    >>> import gymnasium as gym, numpy as np, rlconnect as rc
    >>> @rc.register_connector("AddOnes")
    ... class AddOnes(rc.LearnerConnector):
    ...     def __call__(self, batch, policy):
    ...         batch["ones"] = np.ones(len(batch), np.float32)
    ...         return batch
    >>> ctx = rc.ConnectorContext(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    >>> pipe = rc.LearnerConnectorPipeline(ctx)
    >>> pipe.append(AddOnes(ctx))
    'AddOnes'
    >>> batch = rc.SampleBatch({"obs": np.zeros((3, 4))})
    >>> sorted(pipe(batch, policy=None).keys()), sorted(batch.keys())
    (['obs', 'ones'], ['obs'])
    """

    member_type = LearnerConnector
    times_every_call = True  # (once per batch: the clock costs nothing beside it)

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Run the members in order on a shallow copy of ``batch`` and return the copy (an
        empty pipeline returns ``batch`` itself)."""
        if not self._members:
            return batch
        with check_scope():  # (no checks, no read, on numpy)
            out: SampleBatch = self._run(batch.copy(), policy)
        return out

    @property
    def takes_tensors(self) -> bool:
        """True when every member takes batches of torch tensors (``takes_tensors``)."""
        return not self.tensor_refusals()

    def tensor_refusals(self) -> list[str]:
        """The names of the members that do not take batches of torch tensors."""
        return [name for name, c in self._members if not getattr(c, "takes_tensors", False)]

    def check_policy(self, policy: Policy) -> None:
        """Ask every member whether ``policy`` provides what it needs: ValueError (naming
        the member, what is missing and the fix) for the first that does not."""
        for name, c in self._members:
            try:
                c.check_policy(policy)
            except ValueError as exc:
                raise ValueError(f"learner connector {name!r}: {exc}") from None
