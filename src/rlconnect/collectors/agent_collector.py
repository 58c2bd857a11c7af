"""One agent's trajectory within one episode: a handle on its rows in the policy collector."""

from __future__ import annotations

from typing import Any

__all__ = ["AgentCollector"]


class AgentCollector:
    """Tracks where an agent's trajectory stands; its rows live in a ``PolicyCollector``.

    Holding rows per policy (not per agent) is what keeps collection batched: the runner
    appends all of a policy's rows of a step in one call. This handle keeps what is
    per-agent: the trajectory id (the key of its rows there), whether the trajectory is
    closed, and reward earned while the agent was not acting (added to its next
    transition).
    """

    __slots__ = (
        "agent_id",
        "agent_index",
        "closed",
        "env_id",
        "eps_id",
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
        self.pending_reward = 0.0
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"AgentCollector(agent={self.agent_id!r}, env={self.env_id}, "
            f"policy={self.policy_id!r}, eps={self.eps_id})"
        )
