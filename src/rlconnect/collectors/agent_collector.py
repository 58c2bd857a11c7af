"""One agent's trajectory: a view of its rows in its policy's collector.

Rows are stored per policy, not per agent: that is what keeps collection batched (every
poll appends all of a policy's rows in one chunk, and a batch is built with one sort).
An ``AgentCollector`` is the per-agent face of that store: the rows one trajectory holds
there, its last row, and the row that closes it when its agent ends without a final
observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches.columns import EMPTY_INFO

if TYPE_CHECKING:
    from rlconnect.collectors.policy_collector import PolicyCollector

__all__ = ["AgentCollector"]


class AgentCollector:
    """The rows of trajectory ``traj_id`` in ``collector`` (in arrival order: time order)."""

    __slots__ = ("collector", "traj_id")

    def __init__(self, collector: PolicyCollector, traj_id: int) -> None:
        self.collector = collector
        self.traj_id = int(traj_id)

    def rows(self) -> np.ndarray:
        """Indices of the trajectory's rows in the collector's store, in time order."""
        return np.flatnonzero(self.collector.trajectory_ids() == self.traj_id)

    def __len__(self) -> int:
        return len(self.rows())

    def last_row(self) -> dict[str, Any] | None:
        """The trajectory's latest row (columns of one row; None: it holds no row)."""
        rows = self.rows()
        return self.collector.copy_rows(rows[-1:]) if len(rows) else None

    def close(
        self,
        poll: int,
        reward: float,
        terminated: bool,
        truncated: bool,
        t: int,
        inputs: Mapping[str, Any] = MappingProxyType({}),
    ) -> bool:
        """End the trajectory with a row repeating its last one (so the last transition's
        ``new_obs`` is the agent's last observation: none is made up) that holds
        ``reward``, the flags, no info and episode length ``t``, and ``inputs`` (columns
        of one row, e.g. the agent pipeline's ``rewards`` and ``prev_*`` for the agent's
        next row, each kept to the dtype of the column it replaces). Returns whether
        there was a row to repeat."""
        cols = self.last_row()
        if cols is None:
            return False
        cols["rewards"] = np.asarray([reward], dtype=cols["rewards"].dtype)
        cols["terminateds"] = np.asarray([terminated])
        cols["truncateds"] = np.asarray([truncated])
        cols["infos"] = [EMPTY_INFO]
        cols["t"] = np.asarray([t], dtype=np.int64)
        for name, value in inputs.items():
            cols[name] = _cast_like(value, cols.get(name))
        self.collector.add_rows(np.asarray([self.traj_id]), poll, cols, last=True)
        return True

    def __repr__(self) -> str:
        return f"AgentCollector(policy={self.collector.policy_id!r}, traj={self.traj_id})"


def _cast_like(value: Any, like: Any) -> Any:
    """``value`` in the dtype of ``like``, an array or a nest of arrays (leaf by leaf), so
    a stored column keeps one dtype; as it is when ``like`` is None (a new column)."""
    if like is None:
        return value
    if isinstance(like, np.ndarray):
        return np.asarray(value, dtype=like.dtype)
    return tree.map_structure(lambda v, x: np.asarray(v, dtype=x.dtype), value, like)
