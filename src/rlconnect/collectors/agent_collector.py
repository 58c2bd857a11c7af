"""One agent's trajectory within one episode: a handle on its rows in the policy collector."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.collectors.policy_collector import TRAJ, PolicyCollector

__all__ = ["AgentCollector"]


class AgentCollector:
    """Tracks where an agent's trajectory stands; its rows live in a ``PolicyCollector``.

    Holding rows per policy (not per agent) is what keeps collection batched: the runner
    appends all of a policy's rows of a step in one call. This handle keeps what is
    per-agent: the trajectory id, the row whose action is pending, and reward earned
    while the agent was not acting (added to its next transition).
    """

    __slots__ = (
        "agent_id",
        "agent_index",
        "closed",
        "env_id",
        "eps_id",
        "last_row",
        "pending_reward",
        "policy_id",
        "traj_id",
    )

    def __init__(
        self,
        traj_id: int,
        env_id: int,
        agent_id: Any,
        policy_id: str,
        eps_id: int,
        agent_index: int,
    ) -> None:
        self.traj_id = traj_id
        self.env_id = env_id
        self.agent_id = agent_id
        self.policy_id = policy_id
        self.eps_id = eps_id
        self.agent_index = agent_index
        self.last_row = -1
        self.pending_reward = 0.0
        self.closed = False

    def build(self, collector: PolicyCollector) -> SampleBatch:
        """This trajectory's transitions recorded so far (a copy; the collector keeps them)."""
        traj = collector.column(TRAJ)
        rows = np.flatnonzero(traj == self.traj_id)
        return collector._transitions(rows[:-1], rows[1:])

    def __repr__(self) -> str:
        return (
            f"AgentCollector(agent={self.agent_id!r}, env={self.env_id}, "
            f"policy={self.policy_id!r}, eps={self.eps_id})"
        )
