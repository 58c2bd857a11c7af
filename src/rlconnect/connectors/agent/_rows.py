"""Per-row state of the tensor path, for the stateful agent connectors.

On the tensor path a policy's rows keep a fixed layout at every poll (row i is the same
``(sub-env, agent)``), so per-agent state is a tensor ``(R, ...)`` indexed by row, not a
table of slots keyed by ``(env_id, agent_id)`` as on numpy (``_slots.SlotTable``). A
``RowState`` holds those tensors and a bool ``fresh`` ``(R,)``: rows whose episode starts
at their next real call. ``reset_where(ended)`` marks rows fresh with one gather
(``ended[env_ids]``); nothing here reads a tensor on the host::

    rows = RowState()
    fresh = rows.begin(data, lambda r, device: {"frames": torch.zeros(r, k, ...)})
    ...                                   # outputs use fresh to start new episodes
    rows.put("frames", stacked, data.mask)  # rows outside the mask keep their state
    rows.reset_where(ended)

A new layout (another row count or device) starts every row afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tree

__all__ = ["RowState", "expand_rows"]


def expand_rows(mask: Any, like: Any) -> Any:
    """A bool ``(R,)`` tensor viewed as ``(R, 1, ..., 1)`` to select rows of ``like``."""
    return mask.reshape(-1, *([1] * (like.dim() - 1)))


class RowState:
    """Tensors ``(R, ...)`` of per-row state plus which rows start afresh."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.fresh: Any = None  # bool (R,) once the layout is known
        self.env_ids: Any = None

    def begin(self, data: Any, make: Callable[[int, Any], dict[str, Any]]) -> Any:
        """The ``fresh`` rows of this call (state built by ``make(R, device)`` for a new
        layout); rows inside ``data.mask`` are not fresh after it."""
        import torch

        env_ids = data.env_ids
        rows = env_ids.shape[0]
        fresh = self.fresh
        if fresh is None or fresh.shape[0] != rows or fresh.device != env_ids.device:
            self.tensors = make(rows, env_ids.device)
            fresh = torch.ones(rows, dtype=torch.bool, device=env_ids.device)
        self.env_ids = env_ids
        self.fresh = torch.zeros_like(fresh) if data.mask is None else fresh & ~data.mask
        return fresh

    def put(self, name: str, value: Any, mask: Any) -> None:
        """Store ``value`` (a tensor or a nest of them, cast to the state's dtypes) as the
        state ``name`` of the rows inside ``mask`` (None: every row)."""
        import torch

        def one(old: Any, new: Any) -> Any:
            new = new.to(old.dtype)
            return new if mask is None else torch.where(expand_rows(mask, old), new, old)

        self.tensors[name] = tree.map_structure(one, self.tensors[name], value)

    def reset_where(self, ended: Any) -> None:
        """Rows whose sub-env ended (``ended[env_ids]``) start afresh."""
        if self.fresh is not None:
            self.fresh = self.fresh | ended.to(self.fresh.device)[self.env_ids]

    def reset(self, env_id: int) -> None:
        """Rows of sub-env ``env_id`` start afresh (the numpy hook, on tensor state)."""
        if self.fresh is not None:
            self.fresh = self.fresh | (self.env_ids == int(env_id))

    def to(self, device: Any) -> None:
        """Move the state to ``device``."""
        if self.fresh is not None:
            self.fresh = self.fresh.to(device)
            self.env_ids = self.env_ids.to(device)
            self.tensors = tree.map_structure(lambda v: v.to(device), self.tensors)
