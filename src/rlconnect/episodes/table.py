"""``EpisodeTable``: the running episode of every sub-env, one row each, in arrays.

The one table of episode ids, lengths, returns and agent steps that the tracker, the
agent slots and the step read (single-agent polls advance all of them with one numpy
operation), and the ``Episode`` objects callbacks and the policy mapping function see.
``PollRows`` is what episode bookkeeping reads of a poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from rlconnect.episodes.episode import Episode

__all__ = ["EpisodeTable", "PollRows"]

_DUE_MAX = 256  # polls of multi-agent agent steps logged before they are summed


class PollRows(Protocol):
    """The fields of a poll's rows (``rlconnect.envs.EnvRows``) that episodes read."""

    @property
    def env_ids(self) -> np.ndarray:
        """Each row's sub-env."""

    @property
    def agent_ids(self) -> tuple:
        """Each row's agent id."""

    @property
    def obs(self) -> Any:
        """Each row's observation."""

    @property
    def rewards(self) -> np.ndarray:
        """Each row's reward."""

    @property
    def terminateds(self) -> np.ndarray:
        """Whether each row's agent terminated."""

    @property
    def truncateds(self) -> np.ndarray:
        """Whether each row's agent was truncated."""

    @property
    def is_first(self) -> np.ndarray:
        """Whether each row is its episode's first observation."""

    @property
    def extra_rewards(self) -> Sequence[tuple[int, Any, float, bool, bool]]:
        """Rewards of agents with no row this poll: (env, agent, reward, terminated, truncated)."""

    @property
    def stepped(self) -> np.ndarray:
        """The sub-envs that took an env step this poll (resets do not count), ascending."""

    @property
    def done_envs(self) -> dict[int, tuple[bool, bool]]:
        """``{env_id: (terminated, truncated)}`` of the sub-envs whose episode ended."""

    @property
    def dense(self) -> bool:
        """Single-agent rows, at most one per sub-env in ascending order, no errors or extra
        rewards: the columnar fast path applies."""

    @property
    def plain(self) -> bool:
        """No row is a first one and none has a flag set (a calm poll)."""


class EpisodeTable:
    """Per sub-env: the running ``Episode`` (None: none open), its id (``eps_id``; -1:
    none yet), ``length`` (env steps), ``ret`` (the episode's return: single-agent summed
    at every poll, multi-agent by the agent slots in row order) and ``agent_steps``
    (transitions so far; those of the last polls are logged until read)."""

    def __init__(self, num_envs: int, first_id: int) -> None:
        self.episodes: list[Episode | None] = [None] * num_envs
        self.eps_id = np.full(num_envs, -1, dtype=np.int64)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.ret = np.zeros(num_envs, dtype=np.float64)
        self.agent_steps = np.zeros(num_envs, dtype=np.int64)
        self._steps_due: list[np.ndarray] = []
        self.next_id = first_id  #: the id of the next episode opened

    def __len__(self) -> int:
        return len(self.episodes)

    def __getitem__(self, env_id: int) -> Episode:
        ep = self.episodes[env_id]
        if ep is None:  # the step opens an episode before anything reads it
            raise RuntimeError(f"sub-env {env_id} has no open episode")
        return ep

    def renew(self, at: np.ndarray) -> None:
        """New ids and zero counters for the episodes just opened in sub-envs ``at``."""
        self.sum_agent_steps()
        self.eps_id[at] = np.arange(self.next_id, self.next_id + len(at))
        self.next_id += len(at)
        self.agent_steps[at] = 0
        self.ret[at] = 0.0

    def count_agent_steps(self, agent_steps: np.ndarray) -> None:
        """Multi-agent: the transitions each sub-env completed at a poll (kept by
        reference: summed with those of other polls when read)."""
        due = self._steps_due
        due.append(agent_steps)
        if len(due) >= _DUE_MAX:
            self.sum_agent_steps()

    def sum_agent_steps(self) -> None:
        """``agent_steps`` made current."""
        if self._steps_due:
            self.agent_steps += np.add.reduce(self._steps_due)
            self._steps_due.clear()
