"""The policy collectors of one runner, the env-step log, and building MultiAgentBatches.

The group keeps one *event* per env step (poll index, sub-env, episode, agent steps it
completed). Batch boundaries are decided on events, then applied to every policy's rows:

- ``truncate_episodes``: the first ``target`` events (or enough to reach ``target`` agent
  steps) are taken; each sub-env is cut after its last taken event. Open trajectories
  keep their cut row, so the next batch continues them (``t`` and ``eps_id`` go on).
- ``complete_episodes``: every event of a finished episode is taken, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.batches.columns import STORE_POLL
from rlconnect.collectors.env_steps import EnvStepLog
from rlconnect.collectors.policy_collector import PolicyCollector

__all__ = ["PolicyCollectorGroup"]

EPS_ID, ENV_ID = SampleBatch.EPS_ID, SampleBatch.ENV_ID


class PolicyCollectorGroup:
    """One PolicyCollector per policy id, plus the env-step log that sizes batches."""

    def __init__(
        self, policy_ids: Iterable[str], num_envs: int, *, compress_observations: bool = False
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

    def __getitem__(self, policy_id: str) -> PolicyCollector:
        return self.collectors[policy_id]

    # -- recording ------------------------------------------------------------------------
    def finish_episodes(
        self, eps_ids: list[int], env_steps: int, agent_steps: int | None = None
    ) -> None:
        """The episodes ``eps_ids`` ended after ``env_steps`` / ``agent_steps`` in total
        (None: as many as env steps, one agent): they now count for ``complete_episodes``
        (where no step of an unfinished episode is ever handed out)."""
        self._finished.update(eps_ids)
        self._finished_steps += env_steps
        self._finished_agent_steps += env_steps if agent_steps is None else agent_steps

    def drop_episode(self, eps_id: int) -> None:
        """Forget everything of a faulty episode: its rows and its env steps."""
        for c in self.collectors.values():
            if len(c):
                c.drop(c.column(EPS_ID) == eps_id)
        if self.env_step_log.size:
            self.env_step_log.keep(np.flatnonzero(self.env_step_log.columns().eps != eps_id))
        self._finished.discard(int(eps_id))

    # -- counting -------------------------------------------------------------------------
    def env_steps(self) -> int:
        """Env steps logged and not yet handed out."""
        return self.env_step_log.size

    def agent_steps(self) -> int:
        """Agent steps (transitions) logged and not yet handed out."""
        return self.env_step_log.agent_steps

    def ready(self, mode: str, target: int, count_by: str) -> bool:
        """True when a batch of ``target`` steps can be built."""
        if mode == "complete_episodes":
            have = self._finished_steps if count_by == "env_steps" else self._finished_agent_steps
        else:
            have = self.env_steps() if count_by == "env_steps" else self.agent_steps()
        return have >= target

    # -- building -------------------------------------------------------------------------
    def _take_events(self, mode: str, target: int, count_by: str) -> np.ndarray:
        ev = self.env_step_log
        if mode == "complete_episodes":
            return np.isin(ev.columns().eps, np.fromiter(self._finished, np.int64))
        taken = np.zeros(ev.size, dtype=bool)
        if count_by == "env_steps":
            k = min(target, ev.size)
        else:
            k = int(np.searchsorted(np.cumsum(ev.columns().agent_steps), target)) + 1
            k = min(k, ev.size)
        taken[:k] = True
        return taken

    def build(
        self, mode: str, target: int, count_by: str
    ) -> tuple[dict[str, tuple[SampleBatch, np.ndarray]], int]:
        """Hand out one batch: per policy (transitions, trajectory id of each row), env steps."""
        ev = self.env_step_log
        taken = self._take_events(mode, target, count_by)
        env_steps = int(taken.sum())
        if mode == "complete_episodes":
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
                if len(b):
                    batches[pid] = (b, traj)
        ev.keep(np.flatnonzero(~taken))
        if mode == "complete_episodes":  # every finished episode was handed out
            self._finished.clear()
            self._finished_steps = self._finished_agent_steps = 0
        else:
            self._finished &= set(ev.columns().eps.tolist())
        return batches, env_steps

    def nbytes(self) -> int:
        """Bytes held by all row stores."""
        return sum(c.store.nbytes() for c in self.collectors.values())
