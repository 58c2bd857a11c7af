"""Envs: the BaseEnv contract the runner drives, and adapters for every env kind."""

from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.gym_envs import EnvContext, GymEnvs, VectorEnvAdapter
from rlconnect.envs.make import make_base_env
from rlconnect.envs.multi_agent import MultiAgentEnv, MultiAgentEnvs

__all__ = [
    "BaseEnv",
    "EnvContext",
    "EnvRows",
    "GymEnvs",
    "MultiAgentEnv",
    "MultiAgentEnvs",
    "VectorEnvAdapter",
    "make_base_env",
]
