"""Where a step's rows go: straight into the collectors, or buffered as one block.

The step kernel records every poll the same way (observation rows, then the policy's
outputs, then one env-step event per sub-env that stepped). For a *dense* single-agent
poll (``EnvRows.dense``: one row per listed sub-env, no errors) the recorder keeps the
poll in a :class:`RowBlock` and hands ``BLOCK_POLLS`` polls to the collectors as one
chunk: one concatenation per column instead of one chunk per poll. Anything recorded
directly first flushes the block, and so does ``flush()`` (called before a batch is built
or an episode is dropped), so the collectors always hold what per-poll recording would
have given them.

With an env that steps while the runner records (``BaseEnv.steps_while_recording``) the
block also copies each poll's array columns into arrays made once per batch as the poll
comes (:class:`PackedColumns`), so handing it over takes slices, and a spent block's
per-poll arrays are freed a few at each step (``leftovers``): both in time the runner
would otherwise spend waiting for the env.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import tree

from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.collectors.store import fill_rows
from rlconnect.runner.leftovers import Leftovers

__all__ = ["BLOCK_POLLS", "PackedColumns", "Recorder", "RowBlock"]

BLOCK_POLLS = 256  # polls buffered before the block goes to the collectors


def shared_infos(infos: Sequence[Any]) -> list[Any]:
    """Infos as stored: every empty dict becomes the one shared read-only ``EMPTY_INFO``."""
    return [i if i else EMPTY_INFO for i in infos]


_UNSEEN: Any = object()
_TRAJ, _LAST = "__traj__", "__last__"  # the rows' trajectories and ends, packed with them


class PackedColumns:
    """Array columns of consecutive polls, copied into arrays made once per block.

    Handing a block over then slices each column instead of concatenating a part per poll:
    the copy is made while a poll's arrays are fresh, and with an env that steps while the
    runner records (EnvPool) in time the runner would otherwise spend waiting for the step.
    A column that is not, in every poll, a plain array of the poll's rows with one dtype
    and row shape is given up (``take`` returns None): it is merged from its parts."""

    __slots__ = ("_arrays", "_capacity", "_live", "rows")

    def __init__(self, capacity: int) -> None:
        self.rows = 0
        self._capacity = max(capacity, 1)
        self._arrays: dict[str, np.ndarray | None] = {}
        self._live = 0  # columns seen and not given up

    def add(self, n: int, *parts: dict[str, Any]) -> None:
        """Copy the array columns of the next ``n`` rows (each column in one of ``parts``)."""
        start, end = self.rows, self.rows + n
        self._reserve(end)
        arrays, live, seen = self._arrays, self._live, 0
        for columns in parts:
            for name, value in columns.items():
                arr = arrays.get(name, _UNSEEN)
                if arr is None:
                    continue
                if arr is not _UNSEEN:
                    seen += 1
                if type(value) is not np.ndarray or value.shape[:1] != (n,):
                    self._give_up(name, arr)
                elif arr is _UNSEEN:
                    if start:  # no rows of the earlier polls
                        arrays[name] = None
                    else:
                        arr = np.empty((self._capacity, *value.shape[1:]), value.dtype)
                        arr[:end] = value
                        arrays[name] = arr
                        self._live += 1
                elif value.dtype == arr.dtype and value.shape[1:] == arr.shape[1:]:
                    arr[start:end] = value
                else:
                    self._give_up(name, arr)
        if seen < live:  # a column these rows lack: its part is missing
            present = {name for columns in parts for name in columns}
            for name, arr in list(arrays.items()):
                if arr is not None and name not in present:
                    self._give_up(name, arr)
        self.rows = end

    def pad_to(self, rows: int) -> None:
        """Zeros in every column up to row ``rows`` (polls where no row acted)."""
        start, end = self.rows, rows
        if end <= start:
            return
        self._reserve(end)
        for arr in self._arrays.values():
            if arr is not None:
                arr[start:end] = 0
        self.rows = end

    def take(self, name: str, rows: int) -> np.ndarray | None:
        """Column ``name``'s first ``rows`` rows (a view), or None if it is not packed."""
        arr = self._arrays.get(name)
        return None if arr is None or self.rows != rows else arr[:rows]

    def _give_up(self, name: str, arr: Any) -> None:
        if arr is not _UNSEEN and arr is not None:
            self._live -= 1
        self._arrays[name] = None

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows: short arrays grow to twice their size (or ``rows``)."""
        if rows <= self._capacity:
            return
        capacity = max(rows, 2 * self._capacity)
        for name, arr in self._arrays.items():
            if arr is not None:
                grown = np.empty((capacity, *arr.shape[1:]), arr.dtype)
                grown[: self.rows] = arr[: self.rows]
                self._arrays[name] = grown
        self._capacity = capacity


class RowBlock:
    """The rows of consecutive dense polls of one policy (``counts[k]`` rows in poll k);
    with ``capacity`` (rows expected), their array columns are packed as they come."""

    __slots__ = (
        "counts",
        "events",
        "infos_empty",
        "last",
        "outputs",
        "packed",
        "packed_events",
        "packed_outputs",
        "polls",
        "records",
        "traj",
    )

    def __init__(self, capacity: int = 0) -> None:
        #: None: not packed; else the columns of the rows, their outputs, the env steps
        self.packed = PackedColumns(capacity) if capacity else None
        self.packed_outputs = PackedColumns(capacity) if capacity else None
        self.packed_events = PackedColumns(capacity) if capacity else None
        self.infos_empty = True  # every info so far was empty: one shared mapping for all
        self.records: list[dict[str, Any]] = []
        self.outputs: list[dict[str, Any] | None] = []
        self.traj: list[np.ndarray] = []
        self.last: list[np.ndarray] = []
        self.polls: list[int] = []
        self.counts: list[int] = []
        self.events: list[tuple[int, np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return len(self.records)

    def hand_over(self, collectors: PolicyCollectorGroup, pid: str) -> None:
        """Append the buffered rows and env steps to ``collectors`` (the block is spent)."""
        collector = collectors[pid]
        keys = list(map(tuple, self.records))  # (map, not a loop in Python: per poll)
        if keys.count(keys[0]) != len(keys):  # connectors changed columns mid-run: by poll
            for rec, traj, poll, last, out in zip(
                self.records, self.traj, self.polls, self.last, self.outputs
            ):
                rec["infos"] = shared_infos(rec["infos"])
                collector.add_rows(traj, poll, rec, last=last)
                if out is not None:
                    collector.add_outputs(out)
        else:
            total = sum(self.counts)
            trajs = _take(self.packed, _TRAJ, total)
            ends = _take(self.packed, _LAST, total)
            collector.add_rows(
                np.concatenate(self.traj) if trajs is None else trajs,
                np.repeat(np.asarray(self.polls, dtype=np.int64), self.counts),
                {name: self._column(name, total) for name in keys[0]},
                last=np.concatenate(self.last) if ends is None else ends,
            )
            outputs = self._outputs(total)
            if outputs:
                collector.add_outputs(outputs)
        if self.events:  # one event per env step, in poll order
            polls, env_parts, eps_parts = zip(*self.events)
            steps = list(map(len, env_parts))
            total = sum(steps)
            env_ids = _take(self.packed_events, "env", total)
            eps = _take(self.packed_events, "eps", total)
            collectors.add_env_steps(
                np.repeat(np.asarray(polls, dtype=np.int64), steps),
                np.concatenate(env_parts) if env_ids is None else env_ids,
                np.concatenate(eps_parts) if eps is None else eps,
                1,
            )

    def _column(self, name: str, total: int) -> Any:
        packed = _take(self.packed, name, total)
        if packed is not None:
            return packed
        if name == "infos" and self.infos_empty:
            return np.full(total, EMPTY_INFO, dtype=object)
        if name == "infos":  # a list first: fromiter over a generator is slower
            parts = map(itemgetter("infos"), self.records)
            infos = shared_infos(list(chain.from_iterable(parts)))
            return np.fromiter(infos, dtype=object, count=total)
        return _merge(list(map(itemgetter(name), self.records)), self.counts)

    def _outputs(self, total: int) -> dict[str, Any]:
        """Policy outputs of every poll; polls where no row acted read as zeros."""
        acted = list(filter(None, self.outputs))  # (None: no row acted at that poll)
        firsts: dict[str, Any] = {}  # each output's first value (its dtype and row shape)
        for out in reversed(acted):
            firsts.update(out)
        names = {k: firsts[k] for k in dict.fromkeys(chain.from_iterable(acted))}
        packed = self.packed_outputs
        if packed is not None:
            packed.pad_to(total)  # the last polls may have had no outputs
        merged = {}
        for name, tmpl in names.items():
            column = _take(packed, name, total)
            if column is None:
                try:  # every poll has it (a map, not a loop in Python: one item per poll)
                    parts = list(map(itemgetter(name), self.outputs))  # type: ignore[arg-type]
                except (KeyError, TypeError):  # polls where no row acted read as zeros
                    parts = [
                        out[name] if out is not None and name in out else fill_rows(tmpl, None, n)
                        for out, n in zip(self.outputs, self.counts)
                    ]
                column = _merge(parts, self.counts)
            merged[name] = column
        return merged


def _take(packed: PackedColumns | None, name: str, rows: int) -> np.ndarray | None:
    return None if packed is None else packed.take(name, rows)


def _merge(parts: list[Any], counts: list[int]) -> Any:
    """One column from its per-poll parts (arrays, nests of arrays, lists, or scalars
    shared by a poll's rows)."""
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if isinstance(first, list):
        return list(chain.from_iterable(parts))
    if isinstance(first, dict | tuple):
        return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)
    if parts.count(first) == len(parts):
        return first  # the store repeats a scalar for every row
    return np.repeat(np.asarray(parts), counts)


#: what ``rlconnect.testing.recording`` sets for the runners built inside it (tests of the
#: recorder's paths): None keeps the runner's own choice
OVERRIDES: dict[str, bool | None] = {"blocks": None, "steps_while_recording": None}


class Recorder:
    """Records a step's rows, outputs and env steps for the collectors.

    With ``blocks`` (one policy whose rows nothing reads before the batch: no per-step
    callback, no soft horizon) the rows of a dense poll (``EnvRows.dense``) start a block
    of buffered polls; the outputs and env steps of the same step follow the rows' way.
    ``steps_while_recording`` (``BaseEnv.steps_while_recording``): the env steps while a
    poll is recorded, so the recorder packs each poll's arrays as it comes and frees what a
    batch leaves a few items per poll, in time it would otherwise spend waiting.
    """

    def __init__(
        self,
        collectors: PolicyCollectorGroup,
        *,
        blocks: bool,
        steps_while_recording: bool,
    ) -> None:
        if OVERRIDES["blocks"] is not None:
            blocks = blocks and OVERRIDES["blocks"]
        if OVERRIDES["steps_while_recording"] is not None:
            steps_while_recording = OVERRIDES["steps_while_recording"]
        self.collectors = collectors
        self.block_polls = BLOCK_POLLS if blocks else 1
        #: what spent blocks (and handed-out trajectories) leave to free: a few per step
        #: where the env steps meanwhile, at once elsewhere
        self.leftovers = Leftovers(hold=steps_while_recording)
        self.steps_while_recording = steps_while_recording
        self._expected_rows = 0  # what a packed block is made for (it grows if need be)
        #: env steps waiting in the block, not yet counted by the collectors (an attribute,
        #: not a property: the sampling loop reads it at every poll)
        self.buffered_env_steps = 0
        self._block = RowBlock(0)
        self._pid = ""
        self._blocking = False

    def expect(self, env_steps: int, num_envs: int) -> None:
        """About ``env_steps`` env steps of ``num_envs`` sub-envs come before the next batch
        (0: unknown): a packed block is made for them, their episodes' first rows and some
        slack, so that it seldom grows (a copy of all its rows)."""
        self._expected_rows = max(0, env_steps) * 5 // 4 + 2 * num_envs

    def flush(self) -> None:
        """Hand the buffered polls to the collectors."""
        if len(self._block):
            b = self._block
            b.hand_over(self.collectors, self._pid)
            self.leftovers.put(chain(b.records, b.outputs, b.traj, b.last, b.events))
            self._block = RowBlock(0)
            self.buffered_env_steps = 0

    def rows(
        self,
        pid: str,
        traj: np.ndarray,
        poll: int,
        record: dict[str, Any],
        last: np.ndarray,
        *,
        dense: bool,
    ) -> None:
        """Observation rows of ``pid`` at ``poll`` (``record`` is taken over; ``dense``:
        the poll's rows are ``EnvRows.dense``)."""
        self._blocking = block = dense and self.block_polls > 1
        if not block:
            self.flush()
            record["infos"] = shared_infos(record["infos"])
            self.collectors[pid].add_rows(traj, poll, record, last=last)
            return
        b = self._block
        if len(b.records) >= self.block_polls:  # bounded memory: small arrays merged often
            self.flush()
            b = self._block
        n = len(traj)
        if not b.records and self.steps_while_recording:
            b = self._block = RowBlock(max(self._expected_rows, n))
        self._pid = pid
        if b.infos_empty and any(record["infos"]):
            b.infos_empty = False
        if b.packed is not None:
            b.packed.add(n, record, {_TRAJ: traj, _LAST: last})
        b.records.append(record)
        b.traj.append(traj)
        b.polls.append(poll)
        b.counts.append(n)
        b.last.append(last)
        b.outputs.append(None)

    def outputs(self, pid: str, outputs: dict[str, Any], where: np.ndarray | None) -> None:
        """The policy's outputs for the rows just recorded (``where``: the rows that acted;
        the others read as zeros)."""
        if not self._blocking:
            self.collectors[pid].add_outputs(outputs, where)
            return
        b = self._block
        n = b.counts[-1]
        if where is not None:
            outputs = {k: fill_rows(v, where, n) for k, v in outputs.items()}
        b.outputs[-1] = outputs
        packed = b.packed_outputs
        if packed is not None and b.packed is not None:  # (made together)
            packed.pad_to(b.packed.rows - n)  # the polls before this one without outputs
            packed.add(n, outputs)

    def env_steps(
        self, poll: int, env_ids: np.ndarray, eps_ids: np.ndarray, agent_steps: Any
    ) -> None:
        """One env-step event per sub-env in ``env_ids`` (``agent_steps`` each); the last
        record of a step, which then lets go of a few leftovers."""
        if self.steps_while_recording:  # (else nothing is held)
            self.leftovers.release()
        if self._blocking:
            if len(env_ids):
                b = self._block
                b.events.append((poll, env_ids, eps_ids))
                if b.packed_events is not None:
                    b.packed_events.add(len(env_ids), {"env": env_ids, "eps": eps_ids})
                self.buffered_env_steps += len(env_ids)
        elif len(env_ids):
            self.collectors.add_env_steps(poll, env_ids, eps_ids, agent_steps)
