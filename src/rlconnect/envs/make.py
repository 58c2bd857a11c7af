"""Turn whatever the user passed as ``env`` into a BaseEnv with ``num_envs`` sub-envs.

``make_base_env`` asks an ordered registry which adapter takes the env: first the adapters
registered with ``register_env_adapter`` (the latest first), then the built-in ones, in
this order: an ``rc.BaseEnv`` as it is, an ``rc.ExternalEnv``, a gymnasium ``VectorEnv``, a
gymnasium id (or an Atari id with ``preset="atari"``), one env instance (gymnasium,
``rc.MultiAgentEnv`` or PettingZoo), an env creator. Adding a kind of env is one entry in
``_BUILT_IN`` (or one ``register_env_adapter`` call). Env creators (and ids) are built in
env worker processes (``WorkerEnvs``) with ``num_env_workers`` or ``remote_envs`` (one
worker per sub-env), else in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import gymnasium as gym

from rlconnect.envs.atari import atari_env_creator, is_atari_id
from rlconnect.envs.base import BaseEnv, NotAnEnvError
from rlconnect.envs.envpool_env import is_envpool, make_envpool
from rlconnect.envs.external import ExternalEnv, ExternalEnvAdapter, ExternalMultiAgentEnv
from rlconnect.envs.gym_envs import GymEnvs
from rlconnect.envs.multi_agent import MultiAgentEnv, MultiAgentEnvs
from rlconnect.envs.parallel import check_parallel_spec
from rlconnect.envs.settings import EnvSettings
from rlconnect.envs.sub_envs import EnvContext
from rlconnect.envs.vector import VectorEnvAdapter
from rlconnect.envs.workers import WorkerEnvs

__all__ = [
    "EnvFactory",
    "NotAnEnvError",
    "make_base_env",
    "register_env_adapter",
]


Creator = Callable[[EnvContext], Any]


#: ``factory(env, settings) -> BaseEnv``: adapts one kind of env.
EnvFactory = Callable[[Any, EnvSettings], BaseEnv]
_Match = Callable[[Any], bool]


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


def _in_workers(creator: Creator, s: EnvSettings) -> BaseEnv:
    """The sub-envs in env worker processes over shared memory (``rlconnect.envs.workers``):
    ``num_env_workers`` of them, or one per sub-env with ``remote_envs``."""
    return WorkerEnvs(
        creator,
        s.num_envs,
        num_workers=s.num_env_workers or s.num_envs,
        seed=s.seed,
        worker_index=s.worker_index,
        env_config=s.env_config,
        poll_size=s.env_poll_size,
        timeout_s=s.sub_env_timeout_s,
        build_timeout_s=s.env_build_timeout_s,
    )


def _from_envpool(env: Any, s: EnvSettings) -> BaseEnv:
    """``"envpool:<task id>"`` or a pool the user built (``rlconnect.envs.envpool_env``)."""
    return make_envpool(env, s)


def _in_process(creator: Creator, s: EnvSettings) -> BaseEnv:
    """N sub-envs built here: their kind decides the adapter (the first one is built first)."""
    first = creator(s.context(0))
    if isinstance(first, BaseEnv):
        return first
    if isinstance(first, gym.vector.VectorEnv):  # one env of all the sub-envs (the tensor
        return _from_vector_env(first, s)  # path's simulators: each runner builds its own)
    if is_vmas(first):
        return _from_vmas(first, s)
    if isinstance(first, ExternalEnv):
        return _external(first, s)
    envs = [first, *(creator(s.context(i)) for i in range(1, s.num_envs))]
    if isinstance(first, gym.Env):
        return GymEnvs(creator, s.num_envs, envs=envs, contexts=s.contexts())
    if hasattr(first, "observation_spaces") and hasattr(first, "step"):
        return MultiAgentEnvs(creator, s.num_envs, envs=envs, contexts=s.contexts())
    raise NotAnEnvError(
        f"env creator returned {type(first).__name__}, which is not an env (a gymnasium "
        "Env, an rc.MultiAgentEnv, a PettingZoo env, an rc.BaseEnv or an rc.ExternalEnv)"
    )


def _external(env: ExternalEnv, s: EnvSettings) -> BaseEnv:
    """An ExternalEnv runs its episodes in lanes of one adapter (``max_concurrent`` of them)."""
    if s.num_envs != 1 or s.remote_envs:
        raise ValueError(
            f"an ExternalEnv is one env serving up to max_concurrent={env.max_concurrent} "
            f"episodes at once: use num_envs=1 and remote_envs=False (got "
            f"num_envs={s.num_envs}, remote_envs={s.remote_envs})"
        )
    return ExternalEnvAdapter(env, multi_agent=isinstance(env, ExternalMultiAgentEnv))


def _from_creator(user_creator: Creator, s: EnvSettings) -> BaseEnv:
    def creator(ctx: EnvContext) -> Any:
        return _wrap_instance(user_creator(ctx))

    return _hosted(creator, s)


def _hosted(creator: Creator, s: EnvSettings) -> BaseEnv:
    """The sub-envs of a creator: in env worker processes if asked for, else here."""
    if s.in_workers:
        return _in_workers(creator, s)
    return _in_process(creator, s)


def _from_id(env_id: str, s: EnvSettings) -> BaseEnv:
    if s.preset == "atari" and is_atari_id(env_id):
        return _hosted(atari_env_creator(env_id), s)

    def creator(ctx: EnvContext) -> gym.Env:
        return gym.make(env_id, **ctx.config)

    return _hosted(creator, s)


def _is_instance(env: Any) -> bool:
    return isinstance(env, gym.Env | MultiAgentEnv) or _is_pettingzoo(env)


def _from_instance(env: Any, s: EnvSettings) -> BaseEnv:
    """One env instance: one sub-env, which cannot be rebuilt."""
    if s.num_envs != 1:
        raise ValueError(
            f"got one env instance but num_envs={s.num_envs}: pass an env creator "
            "(a function EnvContext -> env) or a gymnasium id to build several"
        )
    instance = _wrap_instance(env)

    def creator(ctx: EnvContext) -> Any:
        raise RuntimeError(
            "this env was passed as an instance, so it cannot be rebuilt after a "
            "failure: pass an env creator to use restart_failed_sub_environments"
        )

    if isinstance(instance, gym.Env):
        return GymEnvs(creator, 1, envs=[instance], contexts=s.contexts())
    return MultiAgentEnvs(creator, 1, envs=[instance], contexts=s.contexts())


def is_tensor_vector_env(env: Any, tensor: bool | None) -> bool:
    """Whether a gymnasium ``VectorEnv`` takes the tensor path: ``tensor`` when set
    (``RunnerConfig(tensor=...)``), else whether it says it lives on a torch device (a
    ``device`` attribute, as Isaac Lab's, ManiSkill's, ``NumpyToTorch`` and
    ``BatchedCartPole`` have: a ``torch.device`` or its name)."""
    if tensor is not None:
        return tensor
    device = getattr(env, "device", None)
    return isinstance(device, str) or type(device).__module__ == "torch"


def is_vmas(env: Any) -> bool:
    """Whether ``env`` is a VMAS environment (``vmas.make_env(...)``)."""
    return (type(env).__module__ or "").startswith("vmas.") and hasattr(env, "reset_at")


def _from_vector_env(env: gym.vector.VectorEnv, s: EnvSettings) -> BaseEnv:
    """A VectorEnv of torch tensors takes the tensor path (``rlconnect.envs.tensor_envs``,
    imported here: it needs torch), any other the numpy one."""
    if is_tensor_vector_env(env, s.tensor):
        from rlconnect.envs.tensor_envs import TorchVectorEnv

        return TorchVectorEnv(env, horizon=s.horizon)
    return VectorEnvAdapter(env, seed=s.seed)


def _from_vmas(env: Any, s: EnvSettings) -> BaseEnv:
    """A VMAS env: multi-agent, on the tensor path."""
    from rlconnect.envs.tensor_envs import VmasEnv

    return VmasEnv(env)


def _kind(cls: type) -> _Match:
    return lambda env: isinstance(env, cls)


_BUILT_IN: list[tuple[_Match, EnvFactory]] = [
    (is_envpool, _from_envpool),  # before ids: gymnasium reads "envpool:X" as module:id
    (_kind(BaseEnv), lambda env, s: env),
    (_kind(ExternalEnv), _external),
    (_kind(gym.vector.VectorEnv), _from_vector_env),
    (is_vmas, _from_vmas),
    (_kind(str), _from_id),
    (_is_instance, _from_instance),
    (callable, _from_creator),
]
_REGISTERED: list[tuple[_Match, EnvFactory]] = []


def register_env_adapter(match: type | _Match, factory: EnvFactory) -> None:
    """Let ``make_base_env`` (and so ``rc.EnvRunner``) take a kind of env it does not know.

    ``match`` is a class (its instances are taken, subclasses included) or a predicate
    ``env -> bool``; ``factory(env, settings)`` returns the ``rc.BaseEnv`` for that env,
    with ``settings`` an ``EnvSettings`` (``num_envs``, ``seed``, ``env_config``, ...). An
    adapter registered later is tried first, and every registered adapter before the
    built-in ones, so a registration can also take over a kind rlconnect knows.
    """
    test = _kind(match) if isinstance(match, type) else match
    if not callable(test) or not callable(factory):
        raise TypeError(
            "register_env_adapter(match, factory) takes a class or a predicate env -> bool, "
            f"and a factory (env, settings) -> BaseEnv; got {type(match).__name__} and "
            f"{type(factory).__name__}"
        )
    _REGISTERED.insert(0, (test, factory))


def adapter_for(env: Any) -> EnvFactory:
    """The factory that adapts ``env``: the first registered, then built-in, that matches."""
    for test, factory in (*_REGISTERED, *_BUILT_IN):
        if test(env):
            return factory
    raise TypeError(
        f"cannot make an env from {type(env).__name__}: pass a gymnasium id, a gymnasium.Env,"
        " an env creator, a VectorEnv, an rc.MultiAgentEnv, a PettingZoo env, an rc.BaseEnv"
        " or an rc.ExternalEnv (or register an adapter with rlconnect.envs.register_env_adapter)"
    )


def make_base_env(env: Any, settings: EnvSettings | None = None, **changes: Any) -> BaseEnv:
    """Adapt ``env`` (id, instance, creator, vector env, multi-agent env, BaseEnv, or a
    kind registered with ``register_env_adapter``) with ``settings`` (an ``EnvSettings``,
    e.g. ``RunnerConfig.env_settings()``; default: its defaults), ``changes`` replacing
    fields of it by name (``make_base_env("CartPole-v1", num_envs=8, seed=0)``).

    With ``preset="atari"`` an ale-py game id gets the env-side Atari preprocessing
    (``rlconnect.envs.atari.make_atari_env``; ``env_config`` goes to it).
    ``num_env_workers`` / ``env_poll_size``: env worker processes and asynchronous polls
    (``remote_envs``: one worker per sub-env, unless ``num_env_workers`` says how many);
    ``sub_env_timeout_s`` bounds one poll of a worker (it is killed and replaced),
    ``env_build_timeout_s`` the building of its sub-envs (None: no bound, as here);
    ``"envpool:<task id>"`` and EnvPool pools become an ``EnvPoolEnv``
    (``rlconnect.envs.envpool_env``).
    """
    settings = attrs.evolve(settings or EnvSettings(), **changes)
    # the env creators get a copy of env_config: what they do to it stays theirs
    settings = attrs.evolve(settings, env_config=dict(settings.env_config))
    check_parallel_spec(env, settings)
    return adapter_for(env)(env, settings)
