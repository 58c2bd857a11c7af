"""Envs: the BaseEnv contract the runner drives, and adapters for every env kind."""

from typing import TYPE_CHECKING, Any

from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.external import (
    BadActionError,
    BadObservationError,
    BadRewardError,
    EpisodeError,
    ExternalEnv,
    ExternalEnvAdapter,
    ExternalMultiAgentEnv,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.envs.gym_envs import GymEnvs
from rlconnect.envs.make import make_base_env, register_env_adapter
from rlconnect.envs.multi_agent import MultiAgentEnv, MultiAgentEnvs
from rlconnect.envs.rows import EnvRowsBuilder, ExtraReward
from rlconnect.envs.settings import EnvSettings
from rlconnect.envs.sub_envs import EnvContext
from rlconnect.envs.vector import VectorEnvAdapter

if TYPE_CHECKING:
    from rlconnect.envs.batched_cartpole import BatchedCartPole

__all__ = [
    "BadActionError",
    "BadObservationError",
    "BadRewardError",
    "BaseEnv",
    "BatchedCartPole",
    "EnvContext",
    "EnvRows",
    "EnvRowsBuilder",
    "EnvSettings",
    "EpisodeError",
    "ExternalEnv",
    "ExternalEnvAdapter",
    "ExternalMultiAgentEnv",
    "ExtraReward",
    "GymEnvs",
    "MultiAgentEnv",
    "MultiAgentEnvs",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
    "VectorEnvAdapter",
    "make_base_env",
    "register_env_adapter",
]


def __getattr__(name: str) -> Any:
    """``BatchedCartPole`` is imported when first asked for (it needs torch, which
    ``import rlconnect`` does not import)."""
    if name == "BatchedCartPole":
        from rlconnect.envs.batched_cartpole import BatchedCartPole

        return BatchedCartPole
    raise AttributeError(f"module 'rlconnect.envs' has no attribute {name!r}")
