"""One episode in one sub-env, multi-agent aware: ids, lengths, rewards, user data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Episode"]


class Episode:
    """Bookkeeping of one running episode (what callbacks see).

    ``length`` counts env steps; ``total_reward`` and ``agent_rewards`` use the env's own
    rewards (never the clipped ones). The policy mapping function is called once per agent
    per episode, the first time ``policy_for`` sees the agent.
    """

    def __init__(
        self,
        episode_id: int,
        env_id: int,
        policy_mapping_fn: Callable[..., str],
        *,
        worker: Any = None,
    ) -> None:
        self.episode_id = int(episode_id)
        self.env_id = int(env_id)
        self.length = 0
        self.total_reward = 0.0
        self.agent_rewards: dict[tuple[Any, str], float] = {}
        self.custom_metrics: dict[str, float] = {}
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list[float]] = {}
        self.faulty = False
        self._mapping_fn = policy_mapping_fn
        self._worker = worker
        self._policies: dict[Any, str] = {}
        self._indices: dict[Any, int] = {}

    def policy_for(self, agent_id: Any) -> str:
        """The policy id of ``agent_id``, fixed for the whole episode."""
        pid = self._policies.get(agent_id)
        if pid is None:
            pid = self._mapping_fn(agent_id, self, worker=self._worker)
            if not isinstance(pid, str):
                raise TypeError(
                    f"policy_mapping_fn returned {pid!r} for agent {agent_id!r}; "
                    "it must return a policy id string"
                )
            self._policies[agent_id] = pid
            self._indices[agent_id] = len(self._indices)
        return pid

    def agent_index(self, agent_id: Any) -> int:
        """A small int per agent, in order of first appearance in the episode."""
        if agent_id not in self._indices:
            self.policy_for(agent_id)
        return self._indices[agent_id]

    def get_agents(self) -> list[Any]:
        """Agents seen so far in this episode, in order of appearance."""
        return list(self._indices)

    def to_metrics(self) -> dict[str, Any]:
        """The per-episode record ``runner.get_metrics()`` returns."""
        return {
            "episode_id": self.episode_id,
            "env_id": self.env_id,
            "episode_length": self.length,
            "episode_reward": self.total_reward,
            "agent_rewards": dict(self.agent_rewards),
            "custom_metrics": dict(self.custom_metrics),
            "hist_data": {k: list(v) for k, v in self.hist_data.items()} if self.hist_data else {},
            "episode_faulty": self.faulty,
        }

    def __repr__(self) -> str:
        return (
            f"Episode(id={self.episode_id}, env={self.env_id}, length={self.length}, "
            f"reward={self.total_reward:g})"
        )
