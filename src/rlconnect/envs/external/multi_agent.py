"""The multi-agent ExternalEnv: observations, actions, rewards and infos are per-agent dicts.

Only the agents in an observation dict act at that step; rewards logged for other agents
are held until they next observe (or the episode ends), as for ``rc.MultiAgentEnv``. The
episode hub checks every dict (keyed by agent id, non-empty, one logged action per
observing agent), as it checks a served request's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlconnect.envs.external.checks import EpisodeError
from rlconnect.envs.external.env import ExternalEnv
from rlconnect.envs.external.hub import NO_ACTION

__all__ = ["ExternalMultiAgentEnv"]


class ExternalMultiAgentEnv(ExternalEnv):
    """An ExternalEnv whose agents act in per-agent dicts (override ``run()``).

    Args:
        action_space, observation_space: one space shared by every agent, or dicts
            ``agent_id -> space`` (their keys become ``possible_agents``).
        max_concurrent, get_action_timeout_s, episode_timeout_s: as for ``ExternalEnv``.
    """

    def __init__(
        self,
        action_space: gym.Space | Mapping[Any, gym.Space],
        observation_space: gym.Space | Mapping[Any, gym.Space],
        max_concurrent: int = 100,
        **kwargs: Any,
    ) -> None:
        super().__init__(action_space, observation_space, max_concurrent, **kwargs)  # type: ignore[arg-type]
        agents: list[Any] = []
        for spaces in (observation_space, action_space):
            if isinstance(spaces, Mapping):
                agents += [a for a in spaces if a not in agents]
        self.possible_agents = tuple(agents)

    def _space(self, spaces: Any, agent_id: Any, kind: str) -> gym.Space:
        if not isinstance(spaces, Mapping):
            return spaces
        try:
            return spaces[agent_id]
        except KeyError:
            raise EpisodeError(
                f"agent {agent_id!r} has no {kind} space; known: {list(spaces)}"
            ) from None

    def agent_observation_space(self, agent_id: Any) -> gym.Space:
        """``agent_id``'s observation space: its entry of a Dict space, or the shared space."""
        return self._space(self.observation_space, agent_id, "observation")

    def agent_action_space(self, agent_id: Any) -> gym.Space:
        """``agent_id``'s action space: its entry of a Dict space, or the shared space."""
        return self._space(self.action_space, agent_id, "action")

    def get_action(self, episode_id: Any, observation_dict: Mapping) -> dict:
        """Record the agents' observations; return the policies' actions by agent (blocks)."""
        reply = self._hub.observe(episode_id, observation_dict, NO_ACTION)
        assert reply is not None  # asking for an action always gets a reply
        return dict(reply.wait(self._hub.limits.get_action_timeout_s, f"episode {episode_id!r}"))

    def log_action(self, episode_id: Any, observation_dict: Mapping, action_dict: Mapping) -> None:
        """Record observations and the actions the agents took (one per observing agent)."""
        self._hub.observe(episode_id, observation_dict, action_dict)

    def log_returns(  # type: ignore[override]
        self, episode_id: Any, reward_dict: Mapping, info_dict: Mapping | None = None
    ) -> None:
        """Add each agent's reward to its current step (summed until it next acts)."""
        self._hub.add_returns(episode_id, reward_dict, info_dict)

    def end_episode(self, episode_id: Any, observation_dict: Mapping) -> None:
        """End the episode for every agent (``__all__`` terminated) with final observations."""
        self._hub.observe(episode_id, observation_dict, NO_ACTION, kind="end")
