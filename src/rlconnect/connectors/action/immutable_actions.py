"""ImmutableActions: the returned action arrays are read-only."""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

from rlconnect.connectors._tensors import is_tensor
from rlconnect.connectors.base import ColumnActionConnector
from rlconnect.connectors.registry import register_connector

__all__ = ["ImmutableActions"]


def _read_only(leaf: Any) -> Any:
    if is_tensor(leaf):
        return leaf.clone()
    if not isinstance(leaf, np.ndarray):
        return leaf
    view = leaf.view()  # the policy's own array stays writeable
    view.flags.writeable = False
    return view


@register_connector("ImmutableActions")
class ImmutableActions(ColumnActionConnector):
    """Makes every array of ``actions`` (nests included) a read-only view.

    Nothing is copied: the env receives a view with ``flags.writeable == False``, so an env
    that edits its action in place fails loudly instead of corrupting the recorded batch.

    torch has no read-only tensors, so on the tensor path the env receives a clone of each
    action tensor instead: an edit in place cannot reach the recorded actions, though it
    does not fail (one copy of the actions per step, on their device).
    """

    takes_tensors = True

    def transform(self, value: Any) -> Any:
        """Read-only views of the actions, so an env cannot change the batch in place."""
        if isinstance(value, np.ndarray):
            return _read_only(value)
        return tree.map_structure(_read_only, value)
