"""The runner's side of its checkpoints: what it hands to ``rlconnect.checkpoints`` and
takes back.

``save_checkpoint(runner, path)`` gathers the runner's config and, per policy, a
``PolicySnapshot`` (spec, weights, pipelines) for ``save_runner_checkpoint``;
``restore_runner`` hands its live policies and pipelines to ``restore_policies`` and holds
the pipelines it gets back; ``runner_from_checkpoint`` builds a runner from what
``build_policies`` and ``pipeline_loaders`` rebuild. The file format, its verification and
the checks that a checkpoint fits live in ``rlconnect.checkpoints`` (``runner_format``,
``runner_load``, ``runner_restore``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import attrs
import numpy as np

from rlconnect.checkpoints.runner_load import LoadedCheckpoint, load_checkpoint
from rlconnect.checkpoints.runner_restore import (
    LivePolicy,
    build_policies,
    pipeline_loaders,
    restore_policies,
)
from rlconnect.checkpoints.runner_save import PolicySnapshot, save_runner_checkpoint
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    LearnerConnectorPipeline,
)
from rlconnect.policy import Policy, policy_kind
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.pipelines import PolicyPipelines


class CheckpointedRunner(Protocol):
    """What saving and restoring needs of a runner: its config, policies and pipelines."""

    config: RunnerConfig
    policies: dict[str, Policy]
    pipelines: PolicyPipelines

    def agent_pipeline(self, policy_id: str = ...) -> AgentConnectorPipeline: ...

    def action_pipeline(self, policy_id: str = ...) -> ActionConnectorPipeline: ...

    def learner_pipeline(self, policy_id: str = ...) -> LearnerConnectorPipeline: ...


R = TypeVar("R", bound=CheckpointedRunner)

__all__ = [
    "env_from_spec",
    "restore_runner",
    "runner_from_checkpoint",
    "save_checkpoint",
]


def save_checkpoint(runner: CheckpointedRunner, path: str | os.PathLike[str]) -> None:
    """Write ``runner``'s policies (spec, weights) and pipelines atomically to ``path``."""
    config, omitted = _config_json(runner.config)
    save_runner_checkpoint(
        path, config, omitted, [_snapshot(runner, pid) for pid in runner.policies]
    )


def _snapshot(runner: CheckpointedRunner, pid: str) -> PolicySnapshot:
    policy = runner.policies[pid]
    agent, action = runner.agent_pipeline(pid), runner.action_pipeline(pid)
    return PolicySnapshot(
        policy_id=pid,
        kind=policy_kind(policy),
        kwargs=policy.get_config(),
        observation_space=policy.observation_space,
        action_space=policy.action_space,
        env_observation_space=agent.input_space,
        env_action_space=action.input_space,
        weights={k: np.asarray(v) for k, v in policy.get_weights().items()},
        weights_seq=policy.weights_seq,
        agent_pipeline=agent,
        action_pipeline=action,
        learner_pipeline=runner.learner_pipeline(pid),
    )


def _config_json(config: RunnerConfig) -> tuple[dict[str, Any], list[str]]:
    """The config's JSON-able fields, and the names of those left out."""
    out, omitted = {}, []
    for key, value in config.to_dict().items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            omitted.append(key)
            continue
        out[key] = value
    omitted += [a.name for a in attrs.fields(RunnerConfig) if a.name not in out]
    return out, sorted(set(omitted))


def restore_runner(runner: CheckpointedRunner, path: str | os.PathLike[str]) -> None:
    """Load weights and pipelines (with statistics) from ``path`` into ``runner``.

    Everything is verified and checked against the runner first; on any error the runner
    is unchanged. A pipeline that differs from the saved one is replaced by it (fetch it
    again with ``runner.agent_pipeline(pid)``); see ``restore_policies``.
    """
    live = {
        pid: LivePolicy(
            policy,
            runner.agent_pipeline(pid),
            runner.action_pipeline(pid),
            runner.learner_pipeline(pid),
        )
        for pid, policy in runner.policies.items()
    }
    pipes = runner.pipelines
    for pid, held in restore_policies(load_checkpoint(path), live).items():
        pipes.agent[pid], pipes.action[pid] = held.agent, held.action
        pipes.learner[pid] = held.learner


def _runner_config(ck: LoadedCheckpoint, overrides: Mapping[str, Any] | None) -> RunnerConfig:
    """The saved RunnerConfig (CheckpointError if invalid), with ``overrides`` applied.

    The saved file paths (``OfflineConfig``'s ``output`` and ``input``) are left at their
    defaults (``RunnerConfig.without_paths``): a file must not make the runner create,
    write or read files elsewhere. Configs saved with the offline settings as top-level
    keys (before ``RunnerConfig.offline``) load the same."""
    overrides = dict(overrides or {})
    saved = ck.saved_config(RunnerConfig.keywords(), overridden=overrides)
    try:
        config = RunnerConfig(**saved).without_paths()
    except (ValueError, TypeError) as exc:
        raise ck.defect(f"invalid config: {exc}") from None
    return attrs.evolve(config, **overrides)


class ZeroArgEnvCreator:
    """An env creator ``f(env_context)`` over a user's function that takes no argument
    (it pickles when the function does, so remote runners get it too)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self, ctx: Any = None) -> Any:
        return self.fn()


def _takes_no_argument(fn: Callable[..., Any]) -> bool:
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: assume f(ctx)
        return False
    try:
        sig.bind(None)
    except TypeError:
        return True
    return False


def env_from_spec(env: Any) -> Any:
    """What ``from_checkpoint(env=...)`` builds on: anything but a ``"module:function"``
    string as it is; that form (the command line's ``--env``) imports ``module`` and
    gives its env creator (a function of the env context, or of nothing). ``module:EnvId``
    (gymnasium's form: importing registers the id) and ``envpool:Task`` stay strings.
    A module that does not import, or a name it lacks, is a ValueError saying so."""
    if not isinstance(env, str) or ":" not in env or env.startswith("envpool:"):
        return env
    import importlib

    module, _, attr = env.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"env {env!r}: cannot import module {module!r} ({exc}); put it on the path (the "
            "current folder or PYTHONPATH), or pass the env creator itself"
        ) from exc
    creator = getattr(mod, attr, None)
    if callable(creator):
        return ZeroArgEnvCreator(creator) if _takes_no_argument(creator) else creator
    import gymnasium as gym

    if attr in gym.registry:  # module:EnvId, registered by importing the module
        return env
    raise ValueError(
        f"env {env!r}: module {module!r} has no function {attr!r} and registers no gymnasium "
        "id of that name; give module:function (an env creator) or a gymnasium id"
    )


def runner_from_checkpoint(
    cls: Callable[..., R],
    path: str | os.PathLike[str],
    *,
    env: Any,
    policy_mapping_fn: Callable[..., str] | None = None,
    callbacks: Any = None,
    config_overrides: Mapping[str, Any] | None = None,
) -> R:
    """Rebuild a whole runner (policies, config, pipelines, weights) from ``path``.

    The saved config's ``output`` and ``input`` paths are not used (a checkpoint never
    chooses where the runner writes or reads files); give them in ``config_overrides``.
    """
    env = env_from_spec(env)
    ck = load_checkpoint(path)
    config = _runner_config(ck, config_overrides)
    loaders = pipeline_loaders(ck)
    return cls(
        env,
        build_policies(ck),
        policy_mapping_fn=policy_mapping_fn,
        config=config,
        callbacks=callbacks,
        agent_pipelines=loaders["agent"],
        action_pipelines=loaders["action"],
        learner_pipelines=loaders["learner"],
    )
