"""How a batch is cut from the collected rows: the two choices ``RunnerConfig`` names."""

from __future__ import annotations

import enum

__all__ = ["BatchMode", "CountStepsBy"]


class BatchMode(str, enum.Enum):
    """How ``sample()`` cuts episodes."""

    TRUNCATE_EPISODES = "truncate_episodes"
    COMPLETE_EPISODES = "complete_episodes"


class CountStepsBy(str, enum.Enum):
    """What ``rollout_fragment_length`` counts."""

    ENV_STEPS = "env_steps"
    AGENT_STEPS = "agent_steps"
