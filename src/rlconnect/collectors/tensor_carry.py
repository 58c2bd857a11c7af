"""NEXT_STEP rows on the tensor path: exactly T rows per sub-env, the rest carried.

A NEXT_STEP env spends a step of a sub-env on each reset: the step after an end returns
the new episode's first observation and ignores the action, so it is no transition and
no row. In T rounds such a sub-env records fewer than T transitions. The kernel therefore
polls extra rounds (how many follows from the sample's read: ``extra_rounds``) and
``NextStepRows.build`` hands out, per slot (sub-env and agent), the first T rows of its
carried rows followed by this sample's transitions, in time order; the transitions beyond
T are kept on the device and are the slot's first rows in the next sample. No row is lost
or handed out twice, each slot's rows are contiguous in time order, and the batch folds
with ``time_major()``. A carried row keeps the ``weights_seq`` of the sample that
recorded it.

In m extra rounds a sub-env records at least ``floor(m / 2)`` transitions (a reset step
is always followed by a real one), ``ceil(m / 2)`` when its first extra round is not a
reset, so ``m = max(2 * deficit - 1 + resets_next)`` gives every sub-env its T rows
without a further read. A faulty sub-env (``restart_failed_sub_environments``) hands out
all its rows before its bad round and carries none: it is reset after the sample, and its
next episode's rows start the next sample.

Which rows are transitions is host data from the sample's reads (``valid``); the rows
are moved on the device with ``index_select`` / ``index_copy_`` (two per column).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch

from rlconnect.batches import SampleBatch
from rlconnect.batches.time_major import ROWS_PER_ENV, UNEQUAL_ROWS
from rlconnect.collectors.tensor_store import TensorStore

__all__ = ["NextStepRows", "rows_meta"]


@attrs.frozen
class _Plan:
    """Where each handed-out and each carried row of one policy's slots comes from: the
    store's time-major rows (``new_*``) or the old carry (``old_*``), into the batch
    (``*_out``) or the new carry (``*_keep``); as (source, destination) index tensors."""

    counts: np.ndarray  #: (R,) rows handed out per slot
    capacity: int  #: rows per slot of the new carry
    new_out: tuple[torch.Tensor, torch.Tensor]
    old_out: tuple[torch.Tensor, torch.Tensor] | None
    new_keep: tuple[torch.Tensor, torch.Tensor] | None
    old_keep: tuple[torch.Tensor, torch.Tensor] | None


class _Carry:
    """One policy's carried rows: per column a nest of ``(R * capacity, ...)`` tensors,
    slot major, with each row's ``weights_seq``; ``counts`` (R,) rows per slot."""

    def __init__(self, rows: int) -> None:
        self.counts = np.zeros(rows, dtype=np.int64)
        self.capacity = 0
        self.columns: dict[str, Any] = {}
        self.weights: torch.Tensor | None = None


class NextStepRows:
    """NEXT_STEP bookkeeping of ``num_envs`` sub-envs: ``resets`` (device, (N,) bool):
    the sub-envs whose next step only resets them; ``first_resets`` (host): the same as
    of the sample's first round; ``carried`` (host, (N,)): the rows each carries into
    the next sample."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.device = device
        self.resets = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.first_resets = np.zeros(num_envs, dtype=bool)
        self.carried = np.zeros(num_envs, dtype=np.int64)
        self._carry: dict[str, _Carry] = {}

    def valid(self, ended_rounds: np.ndarray, bad: Mapping[int, int]) -> np.ndarray:
        """(K, N) bool: which of the sample's rounds' rows are transitions, from which
        sub-envs ended at each of them (``ended_rounds`` (K, N)): not the round after an
        end, nor a faulty sub-env's from its bad round on."""
        valid = np.empty(ended_rounds.shape, dtype=bool)
        valid[0] = ~self.first_resets
        valid[1:] = ~ended_rounds[:-1]
        for e, k in bad.items():
            valid[k:, e] = False
        return valid

    def extra_rounds(
        self, valid: np.ndarray, ended_last: np.ndarray, bad: Mapping[int, int], rounds: int
    ) -> int:
        """The rounds to poll after the first ``rounds`` (``valid`` (rounds, N)) so that
        every sub-env but the faulty ones has ``rounds`` rows; ``ended_last``: which
        ended at the last round (their next step only resets)."""
        deficit = rounds - self.carried - valid.sum(0)
        deficit[list(bad)] = 0
        short = deficit > 0
        if not short.any():
            return 0
        return int((2 * deficit - 1 + ended_last)[short].max())

    def build(
        self,
        pid: str,
        store: TensorStore,
        valid: np.ndarray,
        bad: Mapping[int, int],
        constant: Mapping[str, Any],
    ) -> SampleBatch:
        """Policy ``pid``'s batch of ``store.rounds`` rows per slot (all rows before its bad
        round for a faulty sub-env), carried rows first, from its store's ``len(valid)``
        rounds; the rows beyond are carried. ``constant``: ``env_id`` and ``agent_index``
        (R,) and ``weights_seq`` (an int) of this sample's rows."""
        r = store.rows
        agents = r // valid.shape[1]
        carry = self._carry.setdefault(pid, _Carry(r))
        quota = _quota(valid.shape[1], store.rounds, bad)
        plan = _plan(
            np.tile(valid.T, (agents, 1)), carry.counts, np.tile(quota, agents), carry, self.device
        )
        total = int(plan.counts.sum())
        columns = {
            name: _map2(
                lambda rows, old: _gather(rows, old, plan, total),
                store.rows_of(name, len(valid)),
                carry.columns.get(name),
            )
            for name in store.written()
        }
        weights = int(constant["weights_seq"])
        columns["weights_seq"] = _gather_weights(weights, carry.weights, plan, total, self.device)
        slots = np.repeat(np.arange(r), plan.counts)
        at = torch.as_tensor(slots, device=self.device)
        for name in ("env_id", "agent_index"):
            columns[name] = constant[name].index_select(0, at)
        self._keep(carry, store, valid, plan, weights)
        return SampleBatch._from_normalized(columns, total, rows_meta(plan.counts))

    def _keep(
        self, carry: _Carry, store: TensorStore, valid: np.ndarray, plan: _Plan, weights: int
    ) -> None:
        """The new carry of one policy: its rows beyond the handed-out ones."""
        size = plan.capacity * store.rows
        columns = {
            name: _map2(
                lambda rows, old: _carry_rows(rows, old, plan, size),
                store.rows_of(name, len(valid)),
                carry.columns.get(name),
            )
            for name in store.written()
        }
        carry.weights = _carry_weights(weights, carry.weights, plan, size, self.device)
        carry.columns, carry.capacity = columns, plan.capacity
        carry.counts = carry.counts + np.tile(valid.sum(0), store.rows // valid.shape[1])
        carry.counts -= plan.counts

    def finish(
        self, valid: np.ndarray, ended_last: np.ndarray, bad: Mapping[int, int], rounds: int
    ) -> int:
        """After the batches (of ``rounds`` rows per sub-env) are built: the rows each
        sub-env carries on, and which sub-envs' next step (the next sample's first) only
        resets them (not the faulty ones: they are reset by mask); the env steps handed
        out."""
        have = self.carried + valid.sum(0)
        out = np.minimum(have, _quota(valid.shape[1], rounds, bad))
        self.carried = have - out
        self.first_resets = ended_last.copy()
        self.first_resets[list(bad)] = False
        return int(out.sum())


def _quota(num_envs: int, rounds: int, bad: Mapping[int, int]) -> np.ndarray:
    """(N,) the most rows each sub-env hands out: ``rounds``, all for a faulty one."""
    quota = np.full(num_envs, rounds, dtype=np.int64)
    quota[list(bad)] = np.iinfo(np.int64).max
    return quota


def rows_meta(counts: np.ndarray) -> dict[str, Any]:
    """The layout meta of a batch whose slots hold ``counts`` rows each: ``rows_per_env``
    when they are equal, else why ``time_major()`` cannot fold it."""
    if len(counts) and counts.min() == counts.max():
        return {ROWS_PER_ENV: int(counts[0])}
    return {
        UNEQUAL_ROWS: "the tensor path drops the rows of faulty sub-envs "
        "(restart_failed_sub_environments) from their bad step on, so its sub-envs gave "
        f"{int(counts.min())} to {int(counts.max())} rows in this batch; use the flat rows "
        "(every later batch is whole again)"
    }


def _plan(
    valid: np.ndarray, carried: np.ndarray, quota: np.ndarray, carry: _Carry, device: Any
) -> _Plan:
    """The index plan of one policy: ``valid`` (R, K) its slots' transitions, ``carried``
    (R,) the rows each carries in, ``quota`` (R,) the most each hands out."""
    r = len(valid)
    total = carried + valid.sum(1)
    out = np.minimum(total, quota)
    offsets = np.cumsum(out) - out
    slot, rnd = np.nonzero(valid)  # slot major, each slot's rounds in time order
    pos = np.cumsum(valid, axis=1)[slot, rnd] - 1 + carried[slot]
    src = rnd * r + slot
    left = total - out
    capacity = int(left.max()) if r else 0
    goes = pos < out[slot]
    old_slot = np.repeat(np.arange(r), carried)
    j = np.arange(len(old_slot)) - np.repeat(np.cumsum(carried) - carried, carried)
    old_src = old_slot * carry.capacity + j
    old_goes = j < out[old_slot]

    def pair(a: np.ndarray, b: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not len(a):
            return None
        return torch.as_tensor(a, device=device), torch.as_tensor(b, device=device)

    stays = ~goes
    new_out = pair(src[goes], offsets[slot[goes]] + pos[goes])
    return _Plan(
        counts=out,
        capacity=capacity,
        new_out=new_out or (torch.zeros(0, dtype=torch.int64, device=device),) * 2,
        old_out=pair(old_src[old_goes], offsets[old_slot[old_goes]] + j[old_goes]),
        new_keep=pair(src[stays], slot[stays] * capacity + pos[stays] - out[slot[stays]]),
        old_keep=pair(
            old_src[~old_goes],
            old_slot[~old_goes] * capacity + j[~old_goes] - out[old_slot[~old_goes]],
        ),
    )


def _gather(rows: torch.Tensor, old: torch.Tensor | None, plan: _Plan, total: int) -> torch.Tensor:
    """The handed-out rows of one leaf: from the store's time-major ``rows`` and the old
    carry ``old`` (None: the column is new; its carried rows are zeros)."""
    src, dst = plan.new_out
    if plan.old_out is None:  # the store's rows alone, in order
        return rows.index_select(0, src)
    make = torch.empty if old is not None else torch.zeros
    out = make((total, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    out.index_copy_(0, dst, rows.index_select(0, src))
    if old is not None:
        old_src, old_dst = plan.old_out
        out.index_copy_(0, old_dst, old.index_select(0, old_src))
    return out


def _carry_rows(
    rows: torch.Tensor, old: torch.Tensor | None, plan: _Plan, size: int
) -> torch.Tensor:
    """The new carry of one leaf (``size`` rows, slot major; unused rows unset)."""
    make = torch.empty if old is not None or plan.old_keep is None else torch.zeros
    out = make((size, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    if plan.new_keep is not None:
        src, dst = plan.new_keep
        out.index_copy_(0, dst, rows.index_select(0, src))
    if plan.old_keep is not None and old is not None:
        src, dst = plan.old_keep
        out.index_copy_(0, dst, old.index_select(0, src))
    return out


def _gather_weights(
    weights: int, old: torch.Tensor | None, plan: _Plan, total: int, device: Any
) -> torch.Tensor:
    """``weights_seq`` of the handed-out rows: this sample's, the carried rows' own."""
    out = torch.full((total,), weights, dtype=torch.int64, device=device)
    if plan.old_out is not None and old is not None:
        src, dst = plan.old_out
        out.index_copy_(0, dst, old.index_select(0, src))
    return out


def _carry_weights(
    weights: int, old: torch.Tensor | None, plan: _Plan, size: int, device: Any
) -> torch.Tensor:
    out = torch.full((size,), weights, dtype=torch.int64, device=device)
    if plan.old_keep is not None and old is not None:
        src, dst = plan.old_keep
        out.index_copy_(0, dst, old.index_select(0, src))
    return out


def _map2(fn: Any, store: Any, old: Any) -> Any:
    """``fn(leaf, old leaf or None)`` over the leaves of a column (nests keep their nest)."""
    if isinstance(store, Mapping):
        return {
            key: _map2(fn, v, old.get(key) if isinstance(old, Mapping) else None)
            for key, v in store.items()
        }
    if isinstance(store, tuple):
        olds = old if isinstance(old, tuple) and len(old) == len(store) else (None,) * len(store)
        return tuple(_map2(fn, v, o) for v, o in zip(store, olds))
    return fn(store, old if isinstance(old, torch.Tensor) else None)
