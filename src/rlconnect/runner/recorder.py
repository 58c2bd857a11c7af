"""Where a step's rows go: straight into the collectors, or buffered as one block.

The step kernel records every poll the same way (observation rows, then the policy's
outputs, then one env-step event per sub-env that stepped). For a *dense* single-agent
poll (``EnvRows.dense``: one row per listed sub-env, no errors) the recorder keeps the
poll in a :class:`RowBlock` and hands ``BLOCK_POLLS`` polls to the collectors as one
chunk: one concatenation per column instead of one chunk per poll. Anything recorded
directly first flushes the block, and so does ``flush()`` (called before a batch is built
or an episode is dropped), so the collectors always hold what per-poll recording would
have given them; ``tests/runner/test_dense_path.py`` compares both batch for batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import tree

from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.collectors.store import fill_rows

__all__ = ["BLOCK_POLLS", "Recorder", "RowBlock"]

BLOCK_POLLS = 256  # polls buffered before the block goes to the collectors


def shared_infos(infos: Sequence[Any]) -> list[Any]:
    """Infos as stored: every empty dict becomes the one shared read-only ``EMPTY_INFO``."""
    return [i if i else EMPTY_INFO for i in infos]


class RowBlock:
    """The rows of consecutive dense polls of one policy (``counts[k]`` rows in poll k)."""

    __slots__ = (
        "counts",
        "events",
        "infos_empty",
        "last",
        "outputs",
        "polls",
        "records",
        "traj",
    )

    def __init__(self) -> None:
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
        keys = [tuple(rec) for rec in self.records]
        if keys.count(keys[0]) != len(keys):  # connectors changed columns mid-run: by poll
            for rec, traj, poll, last, out in zip(
                self.records, self.traj, self.polls, self.last, self.outputs
            ):
                rec["infos"] = shared_infos(rec["infos"])
                collector.add_rows(traj, poll, rec, last=last)
                if out is not None:
                    collector.add_outputs(out)
        else:
            collector.add_rows(
                np.concatenate(self.traj),
                np.repeat(np.asarray(self.polls, dtype=np.int64), self.counts),
                {name: self._column(name) for name in keys[0]},
                last=np.concatenate(self.last),
            )
            outputs = self._outputs()
            if outputs:
                collector.add_outputs(outputs)
        if self.events:  # one event per env step, in poll order
            steps = [len(env_ids) for _, env_ids, _ in self.events]
            collectors.add_env_steps(
                np.repeat(np.asarray([p for p, _, _ in self.events], dtype=np.int64), steps),
                np.concatenate([env_ids for _, env_ids, _ in self.events]),
                np.concatenate([eps for _, _, eps in self.events]),
                1,
            )

    def _column(self, name: str) -> Any:
        total = sum(self.counts)
        if name == "infos" and self.infos_empty:
            return np.full(total, EMPTY_INFO, dtype=object)
        if name == "infos":  # a list first: fromiter over a generator is slower
            infos = shared_infos(list(chain.from_iterable(rec["infos"] for rec in self.records)))
            return np.fromiter(infos, dtype=object, count=total)
        return _merge([rec[name] for rec in self.records], self.counts)

    def _outputs(self) -> dict[str, Any]:
        """Policy outputs of every poll; polls where no row acted read as zeros."""
        names: dict[str, Any] = {}
        for out in self.outputs:
            if out is not None:
                for k, v in out.items():
                    names.setdefault(k, v)
        return {
            name: _merge(
                [
                    out[name] if out is not None and name in out else fill_rows(tmpl, None, n)
                    for out, n in zip(self.outputs, self.counts)
                ],
                self.counts,
            )
            for name, tmpl in names.items()
        }


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
    if all(p == first for p in parts):
        return first  # the store repeats a scalar for every row
    return np.repeat(np.asarray(parts), counts)


class Recorder:
    """Records a step's rows, outputs and env steps for the collectors.

    ``rows(..., block=True)`` starts buffering (dense polls of a single policy); the
    outputs and env steps of the same step follow the rows' mode.
    """

    def __init__(self, collectors: PolicyCollectorGroup, *, block_polls: int = BLOCK_POLLS):
        self.collectors = collectors
        self.block_polls = block_polls
        self.blocks_handed_over = 0  # how often a block reached the collectors (tests)
        #: env steps waiting in the block, not yet counted by the collectors (an attribute,
        #: not a property: the sampling loop reads it at every poll)
        self.buffered_env_steps = 0
        self._block = RowBlock()
        self._pid = ""
        self._blocking = False

    def flush(self) -> None:
        """Hand the buffered polls to the collectors."""
        if len(self._block):
            self._block.hand_over(self.collectors, self._pid)
            self._block = RowBlock()
            self.buffered_env_steps = 0
            self.blocks_handed_over += 1

    def rows(
        self,
        pid: str,
        traj: np.ndarray,
        poll: int,
        record: dict[str, Any],
        last: np.ndarray,
        *,
        block: bool,
    ) -> None:
        """Observation rows of ``pid`` at ``poll`` (``record`` is taken over)."""
        self._blocking = block = block and self.block_polls > 1
        if not block:
            self.flush()
            record["infos"] = shared_infos(record["infos"])
            self.collectors[pid].add_rows(traj, poll, record, last=last)
            return
        b = self._block
        if len(b.records) >= self.block_polls:  # bounded memory: small arrays merged often
            self.flush()
            b = self._block
        self._pid = pid
        if b.infos_empty and any(record["infos"]):
            b.infos_empty = False
        b.records.append(record)
        b.traj.append(traj)
        b.polls.append(poll)
        b.counts.append(len(traj))
        b.last.append(last)
        b.outputs.append(None)

    def outputs(self, pid: str, outputs: dict[str, Any], where: np.ndarray | None) -> None:
        """The policy's outputs for the rows just recorded (``where``: the rows that acted;
        the others read as zeros)."""
        if not self._blocking:
            self.collectors[pid].add_outputs(outputs, where)
            return
        if where is not None:
            n = self._block.counts[-1]
            outputs = {k: fill_rows(v, where, n) for k, v in outputs.items()}
        self._block.outputs[-1] = outputs

    def env_steps(
        self, poll: int, env_ids: np.ndarray, eps_ids: np.ndarray, agent_steps: Any
    ) -> None:
        """One env-step event per sub-env in ``env_ids`` (``agent_steps`` each)."""
        if self._blocking:
            if len(env_ids):
                self._block.events.append((poll, env_ids, eps_ids))
                self.buffered_env_steps += len(env_ids)
        elif len(env_ids):
            self.collectors.add_env_steps(poll, env_ids, eps_ids, agent_steps)
