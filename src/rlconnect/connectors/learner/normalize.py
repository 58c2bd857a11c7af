"""NormalizeAdvantages: advantages standardised over the batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlconnect.connectors.learner.base import LearnerConnector, on_tensors
from rlconnect.connectors.learner.values import float_column
from rlconnect.connectors.registry import register_connector

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = ["STD_FLOOR", "NormalizeAdvantages"]

STD_FLOOR = 1e-8
"""The smallest standard deviation divided by: a batch of equal advantages maps to zeros."""


@register_connector("NormalizeAdvantages")
class NormalizeAdvantages(LearnerConnector):
    """Replaces ``advantages`` with ``(advantages - mean) / max(std, 1e-8)`` over the whole
    batch: the one built-in that changes a column. Put it after ``GAE``.

    The result is a new float32 array: the old column is left as it was, so normalising a
    minibatch slice (a view into a larger batch) never writes into the parent. Any real
    input dtype is taken: the mean and std are computed in float32 for float16 and float32
    columns and in float64 otherwise, so float16 advantages whose squares overflow float16
    (above ~256) and int64 advantages are standardised like their float32 values."""

    takes_tensors: ClassVar[bool] = True

    def __call__(self, batch: SampleBatch, policy: Policy) -> SampleBatch:
        """Put the standardised ``advantages`` in a new column (an empty batch is
        returned as it is); ``policy`` is not used."""
        if on_tensors(batch, "advantages"):
            from rlconnect.connectors.learner.torch_connectors import normalize_on_tensors

            return normalize_on_tensors(self.name, batch, STD_FLOOR)
        adv = float_column(batch, "advantages", self.name)
        if len(adv) == 0:
            return batch
        # a copy (the column itself is only read), in float32 for float16 / float32
        # columns (whose squares float32 holds: the same sums as ever), else in float64
        small_float = adv.dtype.kind == "f" and adv.dtype.itemsize <= 4
        wide = adv.astype(np.float32 if small_float else np.float64)
        wide -= wide.mean()
        wide /= max(float(np.sqrt(np.mean(wide * wide))), STD_FLOOR)
        batch["advantages"] = wide.astype(np.float32)
        return batch
