"""Per-policy trajectory storage: observation rows in, transition batches out, vectorized.

Every observation an agent of the policy receives is one *row* (what the agent pipeline
output, plus bookkeeping); the policy's answer is written into the same row. A transition
is two consecutive rows of one agent trajectory: ``obs``/``actions``/fetches come from the
first, ``rewards``/``terminateds``/``truncateds``/``infos``/``new_obs`` (and
``new_prev_actions``/``new_prev_rewards``) from the second (the column roles are declared
in ``rlconnect.batches.columns``). Building a batch is therefore a stable sort by
trajectory and a shift by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.batches.columns import (
    IMAGE_COLUMNS,
    NEXT_INPUTS_OF,
    NEXT_OBS_OF,
    NEXT_ROW_COLUMNS,
    STORE_COLUMNS,
    STORE_LAST,
    STORE_POLL,
    STORE_TRAJ,
)
from rlconnect.batches.frame_stacks import pack_image_columns, transition_observations
from rlconnect.collectors.store import ColumnStore, fill_rows, zeros_like_rows

__all__ = ["PolicyCollector", "trajectory_order"]


def trajectory_order(traj: np.ndarray) -> np.ndarray:
    """A stable argsort of trajectory ids (int64). The ids in a store lie close together
    (they are handed out in sequence and a batch's rows are recent), so when they span
    fewer than 2**16 values their offsets are sorted as uint16, which numpy sorts stably by
    radix sort, in linear time (int64 gets a merge sort). Same order either way."""
    if len(traj):
        low = traj.min()
        if traj.max() - low < 1 << 16:
            return np.argsort((traj - low).astype(np.uint16), kind="stable")
    return np.argsort(traj, kind="stable")


class PolicyCollector:
    """Rows of every agent trajectory mapped to one policy, in arrival order.

    Frame-stacked ``obs`` / ``new_obs`` of built batches are `FrameStackColumn`s (each frame
    stored once); with ``compress_observations`` the image columns (``obs``, ``new_obs``,
    ``raw_obs`` with at least 2 dims per row, or their frame pool) are LZ4-compressed.
    """

    def __init__(self, policy_id: str, *, compress_observations: bool = False) -> None:
        self.policy_id = policy_id
        self.compress_observations = compress_observations
        self.store = ColumnStore()
        self._answer_like: dict[str, Any] = {}  # the policy's last outputs

    def __len__(self) -> int:
        return self.store.size

    def add_rows(
        self,
        traj_ids: np.ndarray,
        poll: int,
        columns: dict[str, Any],
        last: Any = False,
        outputs: dict[str, Any] | None = None,
        acted: np.ndarray | None = None,
    ) -> int:
        """Append observation rows of ``traj_ids`` (one chunk); returns the first row index.

        ``columns`` is taken over (not copied): pass a fresh dict of fresh arrays; ``last``
        may be a scalar shared by all rows. ``outputs``: what the policy answered for them
        (actions, fetches, state_out), for the rows where ``acted`` is true (None: all;
        the others read as zeros); rows recorded without outputs read as zeros too.
        """
        n = len(traj_ids)
        columns[STORE_TRAJ] = traj_ids
        columns[STORE_POLL] = poll
        columns[STORE_LAST] = last
        if outputs is not None:
            self._answer_like = outputs
            if acted is None:
                columns.update(outputs)
            else:
                for name, value in outputs.items():
                    columns[name] = fill_rows(value, acted, n)
        else:  # zeros, shaped like the policy's last answer: chunks keep the same columns
            for name, value in self._answer_like.items():
                if name not in columns:
                    columns[name] = zeros_like_rows(value, n)
        return self.store.append(columns, n)

    def copy_rows(self, rows: np.ndarray) -> dict[str, Any]:
        """Every non-bookkeeping column at ``rows`` (to build closing rows)."""
        return {n: self.store.take(n, rows) for n in self.store.names if n not in STORE_COLUMNS}

    def drop(self, mask: np.ndarray) -> None:
        """Forget the rows where ``mask`` is true (a faulty episode)."""
        self.store.keep(np.flatnonzero(~mask))

    def column(self, name: str) -> Any:
        """A live column."""
        return self.store.column(name)

    def trajectory_ids(self) -> np.ndarray:
        """The trajectory id of every stored row, in storage order (live, do not modify)."""
        return np.asarray(self.store.column(STORE_TRAJ))

    def build(self, selected: np.ndarray) -> tuple[SampleBatch, np.ndarray]:
        """Transitions between selected rows, trajectories contiguous and in time order.

        Afterwards the store keeps the rows that were not selected, plus the last
        selected row of each trajectory that is still open (its action is pending and it
        starts the next batch). Returns the batch and the trajectory id of each row.
        """
        n = self.store.size
        traj_all = self.store.column(STORE_TRAJ)
        order = trajectory_order(traj_all)
        traj = traj_all[order]
        sel = selected[order]
        same = traj[:-1] == traj[1:] if n else np.zeros(0, dtype=bool)
        pair = same & sel[:-1] & sel[1:]
        rows, nxt = order[:-1][pair], order[1:][pair]
        batch = self._transitions(rows, nxt)
        # keep unselected rows and the last selected row of every open trajectory
        next_selected = np.zeros(n, dtype=bool)
        next_selected[:-1] = same & sel[1:]
        last_sel = sel & ~next_selected
        closed = self.store.column(STORE_LAST)[order]
        keep = ~sel | (last_sel & ~closed)
        self.store.keep(np.sort(order[keep]))
        return batch, traj_all[rows]

    def _transitions(self, rows: np.ndarray, nxt: np.ndarray) -> SampleBatch:
        # observation pairs: frame stacks keep each frame once (rlconnect.batches.frame_stacks)
        pairs = {
            name: transition_observations(self.store.column(name), rows, nxt)
            for name in NEXT_OBS_OF
            if name in self.store
        }
        cols: dict[str, Any] = {}
        for name in self.store.names:
            if name in STORE_COLUMNS:
                continue
            if name in NEXT_ROW_COLUMNS:
                cols[name] = self.store.take(name, nxt)
            elif name in pairs:
                cols[name] = pairs[name][0]
            else:
                cols[name] = self.store.take(name, rows)
        for name, (_, following) in pairs.items():
            cols[NEXT_OBS_OF[name]] = following
        for name, next_name in NEXT_INPUTS_OF.items():
            if name in self.store:
                cols[next_name] = self.store.take(name, nxt)
        pack_image_columns(cols, IMAGE_COLUMNS, compress=self.compress_observations)
        return SampleBatch(cols)
