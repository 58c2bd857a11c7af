"""The policy collectors of one runner, the env-step log, and building MultiAgentBatches.

The group keeps one *event* per env step (poll index, sub-env, episode, agent steps it
completed). Batch boundaries are decided on events, then applied to every policy's rows:

- ``truncate_episodes``: the first ``target`` events (or enough to reach ``target`` agent
  steps) are taken; each sub-env is cut after its last taken event. Open trajectories
  keep their cut row, so the next batch continues them (``t`` and ``eps_id`` go on).
- ``complete_episodes``: every event of a finished episode is taken, nothing else.
- equal rows (``RunnerConfig(equal_rows=True)``, ``rows_per_env=T``; truncating, counting
  env steps): each sub-env's first ``T`` events are taken, once every sub-env has that
  many (sub-envs that ran ahead keep the rest for the next batch). Each policy batch is
  then put in slot order (rows of sub-env 0, then 1, ...; agent-major in a multi-agent
  batch), each slot's ``T`` rows in time order, and carries ``meta["rows_per_env"] = T``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.batches.columns import STORE_POLL
from rlconnect.batches.time_major import ROWS_PER_ENV
from rlconnect.collectors.agent_collector import AgentCollector
from rlconnect.collectors.env_steps import EnvStepLog
from rlconnect.collectors.modes import BatchMode, CountStepsBy
from rlconnect.collectors.policy_collector import PolicyCollector
from rlconnect.episodes.ends import EpisodeEnds

__all__ = ["EnvStepsTaken", "PolicyCollectorGroup", "RowChunk"]


class RowChunk(NamedTuple):
    """One policy's rows of a poll (see ``PolicyCollector.add_rows``): their trajectory
    ids, the columns (taken over), whether each row ends its trajectory (``last``: an
    array or one bool), and the policy's ``outputs`` for the rows that ``acted``."""

    policy_id: str
    traj_ids: np.ndarray
    columns: dict[str, Any]
    last: Any
    outputs: dict[str, Any] | None
    acted: np.ndarray | None


#: the env steps of a poll (``EnvStepLog.add``): sub-envs, their episode ids, and the
#: agent steps each completed (an array, or one number for all)
EnvStepsTaken = tuple[np.ndarray, np.ndarray, "np.ndarray | int"]

EPS_ID, ENV_ID, AGENT_INDEX = SampleBatch.EPS_ID, SampleBatch.ENV_ID, SampleBatch.AGENT_INDEX


def _rank_within(groups: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements share its group (0, 1, 2, ...)."""
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    first = np.searchsorted(sorted_groups, sorted_groups, side="left")
    rank = np.empty(len(groups), dtype=np.int64)
    rank[order] = np.arange(len(groups)) - first
    return rank


class PolicyCollectorGroup:
    """One PolicyCollector per policy id, plus the env-step log that sizes batches."""

    def __init__(
        self,
        policy_ids: Iterable[str],
        num_envs: int,
        *,
        compress_observations: bool = False,
        rows_per_env: int | None = None,
    ) -> None:
        self.collectors = {
            pid: PolicyCollector(pid, compress_observations=compress_observations)
            for pid in policy_ids
        }
        self.num_envs = num_envs
        #: one event per env step (the runner adds each poll's)
        self.env_step_log = EnvStepLog()
        self._finished: set[int] = set()
        self._finished_steps = 0  # env steps of finished episodes still in the log
        self._finished_agent_steps = 0
        #: with equal rows: each sub-env's rows in a batch (None: batches cut by total steps)
        self.rows_per_env = rows_per_env

    def __getitem__(self, policy_id: str) -> PolicyCollector:
        return self.collectors[policy_id]

    # -- recording ------------------------------------------------------------------------
    def record(
        self,
        poll: int,
        chunks: Iterable[RowChunk],
        ends: EpisodeEnds | None,
        steps: EnvStepsTaken | None,
    ) -> None:
        """Everything one poll adds, in one call (the step's one write): each policy's
        ``chunks`` of rows, then what ``ends`` says (the closing rows of agents that ended
        without a final observation, faulty episodes dropped, finished ones counted), then
        the env steps taken (``steps``)."""
        collectors = self.collectors
        for c in chunks:
            collectors[c.policy_id].add_rows(
                c.traj_ids, poll, c.columns, c.last, outputs=c.outputs, acted=c.acted
            )
        if ends is not None:
            self._record_ends(poll, ends)
        if steps is not None:
            self.env_step_log.add(poll, *steps)

    def _record_ends(self, poll: int, ends: EpisodeEnds) -> None:
        for row in ends.closing:  # (agents that ended without a final observation)
            self.agent(row.policy_id, row.traj_id).close(
                poll, row.reward, row.terminated, row.truncated, row.t, row.inputs
            )
        for eps_id in ends.dropped:
            self._drop_episode(eps_id)
        if ends.finished:
            self._finished.update(ends.finished)
            self._finished_steps += ends.env_steps
            agent_steps = ends.env_steps if ends.agent_steps is None else ends.agent_steps
            self._finished_agent_steps += agent_steps

    def _drop_episode(self, eps_id: int) -> None:
        """Forget everything of a faulty episode: its rows and its env steps."""
        for c in self.collectors.values():
            if len(c):
                c.drop(c.column(EPS_ID) == eps_id)
        if self.env_step_log.size:
            self.env_step_log.keep(np.flatnonzero(self.env_step_log.columns().eps != eps_id))
        self._finished.discard(int(eps_id))

    def agent(self, policy_id: str, traj_id: int) -> AgentCollector:
        """The rows of trajectory ``traj_id`` of policy ``policy_id``."""
        return AgentCollector(self.collectors[policy_id], traj_id)

    def held_trajectories(self) -> set[int]:
        """The trajectory ids of every row still held."""
        left = [c.trajectory_ids() for c in self.collectors.values() if len(c)]
        return set(np.concatenate(left).tolist()) if left else set()

    # -- counting -------------------------------------------------------------------------
    def env_steps(self) -> int:
        """Env steps logged and not yet handed out."""
        return self.env_step_log.size

    def agent_steps(self) -> int:
        """Agent steps (transitions) logged and not yet handed out."""
        return self.env_step_log.agent_steps

    def ready(self, mode: BatchMode, target: int, count_by: CountStepsBy) -> bool:
        """True when a batch of ``target`` steps can be built."""
        by_env = count_by is CountStepsBy.ENV_STEPS
        if mode is BatchMode.COMPLETE_EPISODES:
            have = self._finished_steps if by_env else self._finished_agent_steps
        elif self.rows_per_env is not None:
            if self.env_step_log.size < self.rows_per_env * self.num_envs:
                return False
            steps = np.bincount(self.env_step_log.columns().env, minlength=self.num_envs)
            return bool(steps.min() >= self.rows_per_env)
        else:
            have = self.env_steps() if by_env else self.agent_steps()
        return have >= target

    # -- building -------------------------------------------------------------------------
    def _take_events(self, mode: BatchMode, target: int, count_by: CountStepsBy) -> np.ndarray:
        ev = self.env_step_log
        if mode is BatchMode.COMPLETE_EPISODES:
            return np.isin(ev.columns().eps, np.fromiter(self._finished, np.int64))
        if self.rows_per_env is not None:
            return _rank_within(ev.columns().env) < self.rows_per_env
        taken = np.zeros(ev.size, dtype=bool)
        if count_by is CountStepsBy.ENV_STEPS:
            k = min(target, ev.size)
        else:
            k = int(np.searchsorted(np.cumsum(ev.columns().agent_steps), target)) + 1
            k = min(k, ev.size)
        taken[:k] = True
        return taken

    def build(
        self, mode: BatchMode, target: int, count_by: CountStepsBy
    ) -> tuple[dict[str, tuple[SampleBatch, np.ndarray]], int]:
        """Hand out one batch: per policy (transitions, trajectory id of each row), env steps."""
        ev = self.env_step_log
        taken = self._take_events(mode, target, count_by)
        env_steps = int(taken.sum())
        if mode is BatchMode.COMPLETE_EPISODES:
            eps = np.fromiter(self._finished, np.int64)
            select = lambda c: np.isin(c.column(EPS_ID), eps)  # noqa: E731
        else:
            cut = np.full(self.num_envs, -1, dtype=np.int64)
            logged = ev.columns()
            np.maximum.at(cut, logged.env[taken], logged.poll[taken])
            select = lambda c: c.column(STORE_POLL) <= cut[c.column(ENV_ID)]  # noqa: E731
        batches = {}
        for pid, c in self.collectors.items():
            if len(c):
                b, traj = c.build(select(c))
                if len(b) and self.rows_per_env is not None:
                    b, traj = self._slot_major(pid, b, traj)
                if len(b):
                    batches[pid] = (b, traj)
        ev.keep(np.flatnonzero(~taken))
        if mode is BatchMode.COMPLETE_EPISODES:  # every finished episode was handed out
            self._finished.clear()
            self._finished_steps = self._finished_agent_steps = 0
        else:
            self._finished &= set(ev.columns().eps.tolist())
        return batches, env_steps

    def _slot_major(
        self, pid: str, batch: SampleBatch, traj: np.ndarray
    ) -> tuple[SampleBatch, np.ndarray]:
        """``batch`` in slot order (agent-major, then sub-env; each slot's rows in time
        order: the stable sort keeps trajectories whole), checked to have ``T`` rows a slot."""
        rows = self.rows_per_env
        assert rows is not None
        env = np.asarray(batch[ENV_ID], dtype=np.int64).reshape(-1)
        agent = batch.get(AGENT_INDEX)
        keys: list[np.ndarray] = [env]
        if agent is not None:
            keys.append(np.asarray(agent, dtype=np.int64).reshape(-1))
        order = np.lexsort(keys)  # stable: the last key (agent) first, then sub-env
        slots = np.unique(np.stack(keys), axis=1, return_counts=True)[1]
        if slots.min() != rows or slots.max() != rows:
            raise ValueError(
                f"RunnerConfig(equal_rows=True): policy {pid!r} has {int(slots.min())} to "
                f"{int(slots.max())} rows per (sub-env, agent) slot instead of "
                f"rollout_fragment_length={rows}; equal_rows needs every agent to act at "
                "every env step (not turn-based agents, nor agents that leave an episode "
                "early): set equal_rows=False and cut the batch yourself"
            )
        out = batch.take(order)
        out.meta[ROWS_PER_ENV] = rows
        return out, traj[order]

    def nbytes(self) -> int:
        """Bytes held by all row stores."""
        return sum(c.store.nbytes() for c in self.collectors.values())
