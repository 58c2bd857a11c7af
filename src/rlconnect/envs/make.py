"""Turn whatever the user passed as ``env`` into a BaseEnv with ``num_envs`` sub-envs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import gymnasium as gym

from rlconnect.envs.atari import atari_env_creator, is_atari_id
from rlconnect.envs.base import BaseEnv
from rlconnect.envs.envpool_env import is_envpool, make_envpool
from rlconnect.envs.external import ExternalEnv, ExternalEnvAdapter
from rlconnect.envs.gym_envs import EnvContext, GymEnvs, sub_env_seed
from rlconnect.envs.multi_agent import MultiAgentEnv, MultiAgentEnvs
from rlconnect.envs.parallel import check_parallel_spec, in_workers
from rlconnect.envs.remote import RemoteVectorEnv
from rlconnect.envs.vector import VectorEnvAdapter

__all__ = ["make_base_env"]


def _is_pettingzoo(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    names = {c.__name__ for c in type(obj).__mro__}
    return mod.startswith("pettingzoo") or bool(names & {"ParallelEnv", "AECEnv"})


def _wrap_instance(env: Any) -> Any:
    """PettingZoo envs are adapted to the MultiAgentEnv dict API."""
    if _is_pettingzoo(env):
        from rlconnect.envs.pettingzoo import from_pettingzoo

        return from_pettingzoo(env)
    return env


class _RemoteEnvFn:
    """Builds sub-env ``index`` in a worker process, with the context a local one would get."""

    def __init__(
        self, creator: Callable[[EnvContext], Any], ctx: EnvContext, base_seed: int | None = None
    ) -> None:
        self.creator = creator
        self.ctx = ctx
        self._base_seed = base_seed

    def rebuilt(self, restarts: int) -> _RemoteEnvFn:
        """The builder of this sub-env after ``restarts`` restarts (a fresh derived seed)."""
        ctx = attrs.evolve(
            self.ctx, seed=sub_env_seed(self._base_seed, self.ctx.vector_index, restarts)
        )
        return _RemoteEnvFn(self.creator, ctx, self._base_seed)

    def __call__(self) -> gym.Env:
        env = self.creator(self.ctx)
        if not isinstance(env, gym.Env):
            raise TypeError(
                f"remote_envs=True steps single-agent gymnasium envs in worker processes, but "
                f"the env creator returned {type(env).__name__}; use remote_envs=False"
            )
        return env


def _async_vector(
    creator: Callable[[EnvContext], gym.Env],
    num_envs: int,
    seed: int | None,
    env_config: dict,
    worker_index: int,
    timeout_s: float | None = None,
) -> BaseEnv:
    """N sub-envs in worker processes (``RemoteVectorEnv``, gymnasium's AsyncVectorEnv with
    a worker that reports errors per sub-env, a deadline and single-worker restarts).

    NEXT_STEP autoreset lets a finished sub-env reset while the others step, so rows come
    exactly as from N local envs (sub-env ``i`` seeded ``seed + i`` at its first reset).
    """
    fns = [
        _RemoteEnvFn(
            creator,
            EnvContext(i, num_envs, worker_index, sub_env_seed(seed, i), env_config),
            seed,
        )
        for i in range(num_envs)
    ]
    venv = RemoteVectorEnv(fns, timeout_s=timeout_s, seed_of=lambda i, k: sub_env_seed(seed, i, k))
    return VectorEnvAdapter(venv, seed=seed)


def _external(env: ExternalEnv, num_envs: int, remote_envs: bool) -> BaseEnv:
    """An ExternalEnv runs its episodes in lanes of one adapter (``max_concurrent`` of them)."""
    from rlconnect.envs.external_multi_agent import ExternalMultiAgentEnv

    if num_envs != 1 or remote_envs:
        raise ValueError(
            f"an ExternalEnv is one env serving up to max_concurrent={env.max_concurrent} "
            f"episodes at once: use num_envs=1 and remote_envs=False (got num_envs={num_envs}, "
            f"remote_envs={remote_envs})"
        )
    return ExternalEnvAdapter(env, multi_agent=isinstance(env, ExternalMultiAgentEnv))


def make_base_env(
    env: Any,
    *,
    num_envs: int = 1,
    seed: int | None = None,
    env_config: dict | None = None,
    worker_index: int = 0,
    remote_envs: bool = False,
    preset: str | None = None,
    sub_env_timeout_s: float | None = None,
    num_env_workers: int = 0,
    env_poll_size: int | None = None,
    horizon: int | None = None,
    soft_horizon: bool = False,
) -> BaseEnv:
    """Adapt ``env`` (id, instance, creator, vector env, multi-agent env, BaseEnv).

    With ``preset="atari"`` an ale-py game id gets the env-side Atari preprocessing
    (``rlconnect.envs.atari.make_atari_env``; ``env_config`` goes to it). With
    ``remote_envs``, ``sub_env_timeout_s`` bounds each worker's ``step``/``reset``.
    ``num_env_workers`` / ``env_poll_size``: env worker processes and asynchronous polls;
    ``"envpool:<task id>"`` and EnvPool pools become an ``EnvPoolEnv`` (API.md section 9;
    ``horizon`` becomes the pool's ``max_episode_steps``).
    """
    env_config = dict(env_config or {})
    check_parallel_spec(
        env,
        num_envs=num_envs,
        num_env_workers=num_env_workers,
        env_poll_size=env_poll_size,
        remote_envs=remote_envs,
    )
    if is_envpool(env):
        return make_envpool(
            env,
            num_envs=num_envs,
            seed=seed,
            env_config=env_config,
            poll_size=env_poll_size,
            horizon=horizon,
            soft_horizon=soft_horizon,
            preset=preset,
        )
    if isinstance(env, BaseEnv):
        return env
    if isinstance(env, ExternalEnv):
        return _external(env, num_envs, remote_envs)
    if isinstance(env, gym.vector.VectorEnv):
        return VectorEnvAdapter(env, seed=seed)
    if preset == "atari" and isinstance(env, str) and is_atari_id(env):
        creator = atari_env_creator(env)
    elif isinstance(env, str):
        env_id = env

        def creator(ctx: EnvContext) -> gym.Env:
            return gym.make(env_id, **ctx.config)
    elif isinstance(env, gym.Env | MultiAgentEnv) or _is_pettingzoo(env):
        if num_envs != 1:
            raise ValueError(
                f"got one env instance but num_envs={num_envs}: pass an env creator "
                "(a function EnvContext -> env) or a gymnasium id to build several"
            )
        instance = _wrap_instance(env)

        def creator(ctx: EnvContext) -> Any:
            raise RuntimeError(
                "this env was passed as an instance, so it cannot be rebuilt after a "
                "failure: pass an env creator to use restart_failed_sub_environments"
            )

        if isinstance(instance, gym.Env):
            return GymEnvs(creator, 1, seed=seed, envs=[instance], worker_index=worker_index)
        return MultiAgentEnvs(creator, 1, seed=seed, envs=[instance], worker_index=worker_index)
    elif callable(env):
        user_creator = env

        def creator(ctx: EnvContext) -> Any:
            return _wrap_instance(user_creator(ctx))
    else:
        raise TypeError(
            f"cannot make an env from {type(env).__name__}: pass a gymnasium id, a gymnasium.Env,"
            " an env creator, a VectorEnv, an rc.MultiAgentEnv, a PettingZoo env, an rc.BaseEnv"
            " or an rc.ExternalEnv"
        )
    if num_env_workers or (remote_envs and env_poll_size is not None):
        return in_workers(
            creator,
            num_envs,
            num_env_workers=num_env_workers,
            seed=seed,
            env_config=env_config,
            worker_index=worker_index,
            env_poll_size=env_poll_size,
            timeout_s=sub_env_timeout_s,
        )
    if remote_envs:
        return _async_vector(creator, num_envs, seed, env_config, worker_index, sub_env_timeout_s)
    first = creator(EnvContext(0, num_envs, worker_index, seed, env_config))
    if isinstance(first, BaseEnv):
        return first
    if isinstance(first, ExternalEnv):
        return _external(first, num_envs, remote_envs)
    kwargs = {"seed": seed, "worker_index": worker_index, "env_config": env_config}
    rest = [
        creator(
            EnvContext(i, num_envs, worker_index, None if seed is None else seed + i, env_config)
        )
        for i in range(1, num_envs)
    ]
    if isinstance(first, gym.Env):
        return GymEnvs(creator, num_envs, envs=[first, *rest], **kwargs)
    if hasattr(first, "observation_spaces") and hasattr(first, "step"):
        return MultiAgentEnvs(creator, num_envs, envs=[first, *rest], **kwargs)
    raise TypeError(f"env creator returned {type(first).__name__}, which is not an env")
