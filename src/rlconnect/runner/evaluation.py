"""``runner.evaluate``: whole episodes in eval mode on separate sub-envs.

An evaluation builds a short-lived second :class:`EnvRunner` that

- steps its own sub-envs, made from the env the training runner was built from with
  ``rlconnect.envs.make_base_env`` and seeded ``seed + EVAL_SEED_OFFSET + i`` (the same seeds
  on every call: a fixed evaluation set; unseeded when the runner's seed is None);
- shares the training runner's policy objects (current weights, no copy);
- runs copies of the training pipelines (their statistics as of the call, rebuilt from
  ``to_state``; a deep copy for unregistered connectors) in eval mode: filters do not update;
- samples with ``explore=False`` in ``complete_episodes`` mode, and is closed afterwards.

Nothing of it reaches the training runner: not its batches, metrics, connector statistics
or per-episode connector state, perf timers, or the policies' random streams (the numpy and
torch generators held as policy attributes are saved before and restored after, so a
runner that evaluates between ``sample()`` calls samples exactly what one that does not
evaluate samples). The runner's callbacks are called for evaluation episodes too (so
``custom_metrics`` are filled), with ``runner=`` the evaluation runner.

Evaluation sub-envs run in parallel (``min(num_envs, num_episodes)`` of them) and the first
``num_episodes`` episodes to finish are returned, which slightly favours short episodes
when several sub-envs run. An env passed as ``evaluate(env=instance)`` is stepped as one
sub-env and left open (its owner closes it); sub-envs built here are closed afterwards.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import attrs
import gymnasium as gym

from rlconnect.collectors import BatchMode
from rlconnect.connectors import ActionConnectorPipeline, AgentConnectorPipeline
from rlconnect.connectors.pipeline import ConnectorPipeline
from rlconnect.envs import BaseEnv, MultiAgentEnv
from rlconnect.envs.make import make_base_env
from rlconnect.policy import Policy
from rlconnect.runner.config import RunnerConfig


class EvaluatedRunner(Protocol):
    """What an evaluation needs of the runner it evaluates (``EnvRunner`` has it all)."""

    config: RunnerConfig
    env_spec: Any
    num_envs: int
    policies: dict[str, Policy]
    policy_mapping_fn: Callable[..., str]
    callbacks: Any

    def agent_pipeline(self, policy_id: str = ...) -> AgentConnectorPipeline: ...

    def action_pipeline(self, policy_id: str = ...) -> ActionConnectorPipeline: ...

    def sample(self) -> Any: ...

    def get_metrics(self) -> list[dict[str, Any]]: ...

    def stop(self) -> None: ...


__all__ = ["EVAL_SEED_OFFSET", "evaluate"]

EVAL_SEED_OFFSET = 10_000
"""Evaluation sub-env ``i`` is seeded ``seed + EVAL_SEED_OFFSET + i``."""


def _rebuildable(env: Any) -> bool:
    """True for an env spec that can build fresh sub-envs (an id or a creator)."""
    if isinstance(env, str):
        return True
    instance = (gym.Env, gym.vector.VectorEnv, BaseEnv, MultiAgentEnv)
    module = type(env).__module__ or ""
    return callable(env) and not isinstance(env, instance) and not module.startswith("pettingzoo")


def _copy_pipeline(pipe: ConnectorPipeline, num_envs: int) -> ConnectorPipeline:
    ctx = attrs.evolve(
        pipe.ctx,
        config=dict(pipe.ctx.config),
        initial_states=list(pipe.ctx.initial_states),
        is_training=False,
    )
    try:
        state = copy.deepcopy(pipe.to_state())
    except ValueError:  # an unregistered member cannot be rebuilt by name: copy the object
        clone = copy.deepcopy(pipe)
        clone.ctx.is_training = False
        for env_id in range(num_envs):  # drop the training sub-envs' per-episode state
            clone.reset(env_id)
        return clone
    return type(pipe).from_state(ctx, state)


@contextlib.contextmanager
def preserved_random_state(policies: list[Policy]) -> Iterator[None]:
    """Snapshot the policies' random state (``Policy.get_random_state``); put it back after."""
    saved = [(policy, policy.get_random_state()) for policy in policies]
    try:
        yield
    finally:
        for policy, state in saved:
            policy.set_random_state(state)


def _eval_config(config: RunnerConfig, num_envs: int) -> RunnerConfig:
    changes: dict[str, Any] = {
        "num_envs": num_envs,
        "rollout_fragment_length": 1,
        "batch_mode": BatchMode.COMPLETE_EPISODES,
        "explore": False,
        "seed": None,  # the sub-envs are seeded here; None keeps the policies' generators
        "sample_async": False,
        "record_env_actions": False,
        "keep_raw_obs": False,
        "num_env_workers": 0,  # the evaluation env is built (in its workers) already
        "sub_env_timeout_s": None,
        "env_build_timeout_s": None,
        "env_poll_size": None,
        "offline": None,  # evaluation episodes are never written, nor read from files
    }
    return attrs.evolve(config, **changes)


def evaluate(runner: EvaluatedRunner, num_episodes: int = 10, *, env: Any = None) -> list[dict]:
    """Run ``num_episodes`` whole episodes in eval mode; return their metric records.

    ``env`` evaluates on another env (id, creator or instance) instead of fresh sub-envs of
    the runner's own env spec, which is required when the runner was built from an env
    instance (it cannot be rebuilt).
    """
    if isinstance(num_episodes, bool) or not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes must be an integer >= 1, got {num_episodes!r}")
    spec = runner.env_spec if env is None else env
    if env is None and not _rebuildable(spec):
        raise ValueError(
            f"evaluate() needs separate sub-envs, but this runner was built from a "
            f"{type(spec).__name__} instance, which cannot be rebuilt: build the runner from a "
            "gymnasium id or an env creator, or pass evaluate(env=...)"
        )
    cfg = runner.config
    num_envs = min(cfg.num_envs, num_episodes) if _rebuildable(spec) else 1
    seed = None if cfg.seed is None else cfg.seed + EVAL_SEED_OFFSET
    workers = min(cfg.num_env_workers, num_envs) if _rebuildable(spec) else 0
    base_env = make_base_env(
        spec,
        cfg.env_settings(),
        num_envs=num_envs,
        seed=seed,
        num_env_workers=workers,
        env_poll_size=None,  # whole episodes, every sub-env each step
    )
    pids = list(runner.policies)
    records: list[dict] = []
    with preserved_random_state(list(runner.policies.values())):
        build = cast(Callable[..., EvaluatedRunner], type(runner))  # the same class
        evaluator = build(
            base_env,
            runner.policies,
            policy_mapping_fn=runner.policy_mapping_fn,
            config=_eval_config(cfg, base_env.num_envs),
            callbacks=runner.callbacks,
            agent_pipelines={
                p: _copy_pipeline(runner.agent_pipeline(p), runner.num_envs) for p in pids
            },
            action_pipelines={
                p: _copy_pipeline(runner.action_pipeline(p), runner.num_envs) for p in pids
            },
        )
        try:
            while len(records) < num_episodes:
                evaluator.sample()
                records.extend(evaluator.get_metrics())
        finally:
            if _rebuildable(spec):
                evaluator.stop()
    return records[:num_episodes]
