"""Which env specs may run in env worker processes or poll asynchronously."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.envs.base import BaseEnv
from rlconnect.envs.envpool_env import is_envpool
from rlconnect.envs.external import ExternalEnv
from rlconnect.envs.multi_agent import MultiAgentEnv
from rlconnect.envs.settings import EnvSettings

__all__ = ["check_parallel_spec"]


def _instance(env: Any) -> str | None:
    """What kind of built env ``env`` is (None: an id or a creator)."""
    kinds = (
        (ExternalEnv, "an rc.ExternalEnv"),
        (gym.vector.VectorEnv, "a gymnasium VectorEnv"),
        (gym.Env, "a gymnasium.Env instance"),
        (MultiAgentEnv, "an rc.MultiAgentEnv instance"),
    )
    for kind, text in kinds:
        if isinstance(env, kind):
            return text
    if (type(env).__module__ or "").startswith("pettingzoo"):
        return "a PettingZoo env instance"
    return None


def check_parallel_spec(env: Any, settings: EnvSettings) -> None:
    """Raise ``ValueError`` for env workers or asynchronous polls the env cannot have."""
    if isinstance(env, BaseEnv):
        return  # built already (e.g. by make_base_env with these settings): used as it is
    envpool = is_envpool(env)
    workers, poll_size = settings.num_env_workers, settings.env_poll_size
    if settings.in_workers:
        asked = f"num_env_workers={workers}" if workers else "remote_envs=True"
        if envpool:
            raise ValueError(
                f"{asked}: an EnvPool env steps its sub-envs in its own C++ threads; use "
                "num_env_workers=0 and remote_envs=False (and env_config={'num_threads': ...})"
            )
        kind = _instance(env)
        if kind is not None:
            raise ValueError(
                f"{asked} builds the sub-envs in worker processes, but the env is {kind}: "
                "pass a gymnasium id or an env creator (a function EnvContext -> env) instead"
            )
    asynchronous = poll_size is not None and poll_size < settings.num_envs
    if asynchronous and not (settings.in_workers or envpool):
        raise ValueError(
            f"RunnerConfig.env_poll_size={poll_size} polls sub-envs asynchronously, "
            "which needs them in worker processes (num_env_workers >= 1 or "
            "remote_envs=True) or an EnvPool env ('envpool:<task id>'); use "
            "env_poll_size=None to step every sub-env together"
        )
