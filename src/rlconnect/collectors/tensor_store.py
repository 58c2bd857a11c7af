"""The tensor path's store: one preallocated ``[T, R, ...]`` tensor per column.

A policy's rows keep one layout at every round (row r is the same sub-env and agent), so
round k of a ``sample()`` writes row k of every column in place, contiguously: no list
grows, no chunk is merged, nothing is read back. ``build`` hands the rows out slot
(sub-env) major, each slot's ``T`` rows in time order, as the numpy path orders a
trajectory's rows: one transposing copy per column per ``sample()`` (writing ``[R, T]``
storage in place instead costs a strided write per round, measured at about twice as
much). Columns that are the same at every round (``env_id``, ``agent_index``, the
policy's ``weights_seq``) are made at ``build`` from one row each. The batch carries
``meta["rows_per_env"] = T``, so ``time_major()`` views it as ``[T, R]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlconnect.batches import SampleBatch

__all__ = ["TensorStore"]


class TensorStore:
    """``rounds`` rounds of ``rows`` rows per column, on ``device``; columns are made at
    their first write, from its shape and dtype (nested columns leaf by leaf)."""

    def __init__(self, rounds: int, rows: int, device: torch.device) -> None:
        self.rounds, self.rows, self.device = rounds, rows, device
        self._columns: dict[str, Any] = {}
        self._rounds: dict[str, list[Any]] = {}  # per column: the view of each round's row

    def write(self, k: int, columns: Mapping[str, Any]) -> None:
        """Round ``k``'s rows of every column in ``columns`` (tensors (rows, ...), nests
        of them, or Python numbers repeated for every row)."""
        for name, value in columns.items():
            rows = self._rounds.get(name)
            if rows is None:
                store = self._columns[name] = self._alloc(value)
                rows = self._rounds[name] = _round_views(store, self.rounds)
            _write(rows[k], value)

    def _alloc(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {key: self._alloc(v) for key, v in value.items()}
        if isinstance(value, tuple):
            return tuple(self._alloc(v) for v in value)
        if isinstance(value, int | float):
            dtype = torch.int64 if isinstance(value, int) else torch.float32
            return torch.empty((self.rounds, self.rows), dtype=dtype, device=self.device)
        shape = (self.rounds, self.rows, *value.shape[1:])
        return torch.empty(shape, dtype=value.dtype, device=self.device)

    def build(self, constant: Mapping[str, Any], keep: torch.Tensor | None = None) -> SampleBatch:
        """Every column's rows, slot major, with the ``constant`` columns: one row (R,)
        each (or a Python int), the same at every round. ``keep``: the slot-major indices
        of the rows to hand out (the others are dropped; the caller sets the layout meta);
        None: all."""
        t, r = self.rounds, self.rows

        def rows_of(store: Any) -> Any:
            if isinstance(store, Mapping):
                return {k: rows_of(v) for k, v in store.items()}
            if isinstance(store, tuple):
                return tuple(rows_of(v) for v in store)
            flat = store.transpose(0, 1).reshape(r * t, *store.shape[2:])
            return flat if keep is None else flat.index_select(0, keep)

        columns = {name: rows_of(s) for name, s in self._columns.items()}
        count = r * t if keep is None else len(keep)
        for name, value in constant.items():
            if isinstance(value, int):
                columns[name] = torch.full((count,), value, dtype=torch.int64, device=self.device)
            else:
                value = value.repeat_interleave(t)
                columns[name] = value if keep is None else value.index_select(0, keep)
        meta = {"rows_per_env": self.rounds} if keep is None else {}
        return SampleBatch._from_normalized(columns, count, meta)

    def first_nonfinite(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per slot (R,): the first round whose ``obs``, ``new_obs`` or ``rewards`` holds a
        NaN or inf (``T`` where none does), whether it was the reward, and whether it came
        with the step (``new_obs``, reward: 1) or before it (``obs``, only an episode's
        first: 0): the finite check of a whole sample in a few whole-tensor operations."""
        t, r = self.rounds, self.rows
        rounds = torch.arange(t, device=self.device).unsqueeze(1)

        def first(name: str) -> torch.Tensor:  # (R,): first round of a bad row, else T
            ok = torch.ones((t, r), dtype=torch.bool, device=self.device)
            for leaf in _leaves(self._columns[name]):
                if leaf.is_floating_point():
                    ok &= torch.isfinite(leaf.reshape(t, r, -1)).all(2)
            return torch.where(ok, t, rounds).amin(0)

        before, reward = first("obs"), first("rewards")
        after = torch.minimum(first("new_obs"), reward)
        found = torch.minimum(before, after)
        return found, reward == found, (after == found).to(torch.int64)

    def column(self, name: str) -> Any:
        """The ``[T, R, ...]`` storage of column ``name``."""
        return self._columns[name]


def _leaves(store: Any) -> list[torch.Tensor]:
    if isinstance(store, Mapping):
        return [x for v in store.values() for x in _leaves(v)]
    if isinstance(store, tuple):
        return [x for v in store for x in _leaves(v)]
    return [store]


def _round_views(store: Any, rounds: int) -> list[Any]:
    """The view of round k's row of a column (a nest of views for a nested one)."""
    if isinstance(store, Mapping):
        per_key = {key: _round_views(v, rounds) for key, v in store.items()}
        return [{key: views[k] for key, views in per_key.items()} for k in range(rounds)]
    if isinstance(store, tuple):
        parts = [_round_views(v, rounds) for v in store]
        return [tuple(views[k] for views in parts) for k in range(rounds)]
    return list(store.unbind(0))


def _write(row: Any, value: Any) -> None:
    if isinstance(row, Mapping):
        for key, sub in row.items():
            _write(sub, value[key])
    elif isinstance(row, tuple):
        for sub, v in zip(row, value):
            _write(sub, v)
    elif isinstance(value, int | float):
        row.fill_(value)
    else:
        row.copy_(value)
