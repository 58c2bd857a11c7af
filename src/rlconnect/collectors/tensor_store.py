"""The tensor path's store: one preallocated ``[T, R, ...]`` tensor per column.

A policy's rows keep one layout at every round (row r is the same sub-env and agent), so
round k of a ``sample()`` writes row k of every column in place, contiguously: no list
grows, no chunk is merged, nothing is read back. The store lives as long as its runner:
each ``sample()`` writes over the last one's rows, in memory that is already mapped and
warm, and ``build`` copies them out, slot (sub-env) major, each slot's ``T`` rows in time
order, as the numpy path orders a trajectory's rows: one transposing copy per column per
``sample()`` into the batch's own memory (writing ``[R, T]`` storage in place instead
costs a strided write per round, measured at about twice as much). Columns that are the
same at every round (``env_id``, ``agent_index``, the policy's ``weights_seq``) are made at
``build`` from one row each. The batch carries ``meta["rows_per_env"] = T``, so
``time_major()`` views it as ``[T, R]``.

The finite check of a sample is one sum per float column (``any_nonfinite``, a pass
over memory at its bandwidth): a NaN or inf survives a sum. Only when a sum is not finite
(a NaN or inf, or finite values too large to add up) does ``first_nonfinite`` locate the
bad rows, with a few whole-tensor operations (one element at a time, ~30x the cost).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rlconnect.batches import SampleBatch

__all__ = ["TensorStore"]


class TensorStore:
    """``rounds`` rounds of ``rows`` rows per column, on ``device``; columns are made at
    their first write, from its shape and dtype (nested columns leaf by leaf), and reused
    by every later ``sample()`` (round 0 starts one)."""

    def __init__(self, rounds: int, rows: int, device: torch.device) -> None:
        self.rounds, self.rows, self.device = rounds, rows, device
        self.capacity = rounds  #: the rounds the columns have room for (``reserve``)
        self._columns: dict[str, Any] = {}
        self._rounds: dict[str, list[Any]] = {}  # per column: the view of each round's row
        self._written: set[str] = set()  # the columns this sample wrote

    def write(self, k: int, columns: Mapping[str, Any]) -> None:
        """Round ``k``'s rows of every column in ``columns`` (tensors (rows, ...), nests
        of them, or Python numbers repeated for every row)."""
        if k == 0:
            self._written.clear()
        self._written.update(columns)
        for name, value in columns.items():
            rows = self._rounds.get(name)
            if rows is None:
                store = self._columns[name] = self._alloc(value)
                rows = self._rounds[name] = _round_views(store, self.capacity)
            _write(rows[k], value)

    def reserve(self, rounds: int) -> None:
        """Room for ``rounds`` rounds (a NEXT_STEP sample's extra rounds): the columns
        grown, the rows written so far kept; ``build`` still hands out the first
        ``rounds`` given at construction unless told otherwise."""
        if rounds <= self.capacity:
            return
        old, self.capacity = self.capacity, rounds

        def grow(store: torch.Tensor) -> torch.Tensor:
            out = torch.empty((rounds, *store.shape[1:]), dtype=store.dtype, device=self.device)
            out[:old] = store
            return out

        for name, store in self._columns.items():
            self._columns[name] = _map(grow, store)
            self._rounds[name] = _round_views(self._columns[name], rounds)

    def rows_of(self, name: str, rounds: int) -> Any:
        """Column ``name``'s first ``rounds`` rounds as time-major rows ``(rounds * R, ...)``
        (views; a nest for a nested column)."""
        return _map(lambda x: x[:rounds].reshape(-1, *x.shape[2:]), self._columns[name])

    def written(self) -> list[str]:
        """The columns this sample wrote."""
        return [name for name in self._columns if name in self._written]

    def _alloc(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {key: self._alloc(v) for key, v in value.items()}
        if isinstance(value, tuple):
            return tuple(self._alloc(v) for v in value)
        if isinstance(value, int | float):
            dtype = torch.int64 if isinstance(value, int) else torch.float32
            return torch.empty((self.capacity, self.rows), dtype=dtype, device=self.device)
        shape = (self.capacity, self.rows, *value.shape[1:])
        return torch.empty(shape, dtype=value.dtype, device=self.device)

    def build(self, constant: Mapping[str, Any], keep: torch.Tensor | None = None) -> SampleBatch:
        """This sample's rows of every column, slot major, in new tensors (the store is
        written over by the next sample), with the ``constant`` columns: one row (R,)
        each (or a Python int), the same at every round. ``keep``: the slot-major indices
        of the rows to hand out (the others are dropped; the caller sets the layout meta);
        None: all."""
        t, r = self.rounds, self.rows
        fn: Callable[[torch.Tensor], torch.Tensor] = functools.partial(_slot_major, rounds=t)
        count = r * t
        if keep is not None:  # one gather: slot-major row s * T + k is storage row k * R + s
            fn, count = functools.partial(_gather, at=(keep % t) * r + keep // t), len(keep)
        columns = {
            name: _map(fn, store) for name, store in self._columns.items() if name in self._written
        }
        for name, value in constant.items():
            if isinstance(value, int):
                columns[name] = torch.full((count,), value, dtype=torch.int64, device=self.device)
            else:
                value = value.repeat_interleave(t)
                columns[name] = value if keep is None else value.index_select(0, keep)
        meta = {"rows_per_env": self.rounds} if keep is None else {}
        return SampleBatch._from_normalized(columns, count, meta)

    def any_nonfinite(self, names: tuple[str, ...]) -> torch.Tensor:
        """0-d bool: whether a float leaf of columns ``names`` may hold a NaN or inf, from
        one sum per leaf in its own dtype: True for every NaN or inf, and for finite values
        whose sum overflows (a false alarm ``first_nonfinite`` clears; a float64 sum would
        not overflow for float32 values, but converts the column first, 15x the cost)."""
        sums = [
            leaf[: self.rounds].sum()
            for name in names
            for leaf in _leaves(self._columns[name])
            if leaf.is_floating_point()
        ]
        if not sums:
            return torch.zeros((), dtype=torch.bool, device=self.device)
        return ~torch.isfinite(torch.stack(sums)).all()

    def first_nonfinite(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per slot (R,): the first round whose ``obs``, ``new_obs`` or ``rewards`` holds a
        NaN or inf (``T`` where none does), whether it was the reward, and whether it came
        with the step (``new_obs``, reward: 1) or before it (``obs``, only an episode's
        first: 0): where ``any_nonfinite`` fired, in a few whole-tensor operations."""
        t, r = self.rounds, self.rows
        rounds = torch.arange(t, device=self.device).unsqueeze(1)

        def first(name: str) -> torch.Tensor:  # (R,): first round of a bad row, else T
            ok = torch.ones((t, r), dtype=torch.bool, device=self.device)
            for leaf in _leaves(self._columns[name]):
                if leaf.is_floating_point():
                    ok &= torch.isfinite(leaf[:t].reshape(t, r, -1)).all(2)
            return torch.where(ok, t, rounds).amin(0)

        before, reward = first("obs"), first("rewards")
        after = torch.minimum(first("new_obs"), reward)
        found = torch.minimum(before, after)
        return found, reward == found, (after == found).to(torch.int64)

    def column(self, name: str) -> Any:
        """The ``[T, R, ...]`` storage of column ``name``."""
        return self._columns[name]


#: a row of this many bytes is moved as one element of this dtype by ``_slot_major``
_ONE_ELEMENT = {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _slot_major(store: torch.Tensor, rounds: int) -> torch.Tensor:
    """The first ``rounds`` rounds (T) of ``[rounds+, R, ...]`` storage as ``(R * T, ...)``
    rows, slot major, in a new tensor.

    torch's CPU copy transposes a 2-D tensor in cache-sized blocks but a ``[T, R, k]`` one
    element by element: a row of 2 to 16 bytes (``obs`` of 4 float32, say) is moved as
    one element of a dtype that wide, 1.5x-2x faster there (the same bytes either way)."""
    store = store[:rounds]
    t, r = store.shape[:2]
    out = torch.empty((r, t, *store.shape[2:]), dtype=store.dtype, device=store.device)
    wide = _ONE_ELEMENT.get(store[0, 0].numel() * store.element_size())
    if store.dim() > 2 and wide is not None:
        rows = store.reshape(t, r, -1).view(wide).squeeze(2)
        out.view(r, t, -1).view(wide).squeeze(2).copy_(rows.t())
    else:
        out.copy_(store.transpose(0, 1))
    return out.reshape(r * t, *store.shape[2:])


def _gather(store: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """The rows ``at`` of ``[T, R, ...]`` storage's time-major rows, in a new tensor."""
    return store.reshape(-1, *store.shape[2:]).index_select(0, at)


def _map(fn: Any, store: Any) -> Any:
    """``fn`` over the leaves of a column's storage (nested columns keep their nest)."""
    if isinstance(store, Mapping):
        return {key: _map(fn, v) for key, v in store.items()}
    if isinstance(store, tuple):
        return tuple(_map(fn, v) for v in store)
    return fn(store)


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
