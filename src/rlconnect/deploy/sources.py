"""What an export reads: one policy and its two pipelines, from a runner, a group or a file.

``resolve(source, policy_id)`` accepts an ``EnvRunner`` (anything with ``policies``,
``agent_pipeline(pid)`` and ``action_pipeline(pid)``), a ``RunnerGroup`` (its local
runner), the path of a runner checkpoint, or a ``rlconnect sample --out`` run folder (its
``checkpoint`` folder). A checkpoint is verified whole before anything is built, and its
policy is rebuilt by registered kind, exactly as ``EnvRunner.from_checkpoint`` does, but
without an env or a runner.
"""

from __future__ import annotations

import os
from typing import Any, cast

import attrs

from rlconnect.checkpoints.pipelines import load_pipeline
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
)
from rlconnect.errors import CheckpointError
from rlconnect.policy import Policy

__all__ = ["PolicySource", "find_checkpoint", "resolve"]

RUN_CHECKPOINT = "checkpoint"
"""Where ``rlconnect sample --out DIR`` writes the runner's checkpoint inside DIR."""


@attrs.define
class PolicySource:
    """One policy, ready to export: the live (or rebuilt) policy and pipelines."""

    policy_id: str
    policy: Policy
    agent_pipeline: AgentConnectorPipeline
    action_pipeline: ActionConnectorPipeline


def _unknown_id(policy_id: str, ids: list[str]) -> KeyError:
    return KeyError(f"no policy {policy_id!r} to export; policies: {ids}")


def find_checkpoint(path: str | os.PathLike[str]) -> str:
    """The checkpoint folder at ``path``: itself, or a run folder's ``checkpoint``.

    Raises ``FileNotFoundError`` (a ``CheckpointError`` too when it is not a folder)
    saying what is there."""
    root = os.fspath(path)
    if os.path.exists(os.path.join(root, "manifest.json")):  # (a FIFO there is refused later)
        return root
    inner = os.path.join(root, RUN_CHECKPOINT)
    if os.path.exists(os.path.join(inner, "manifest.json")):
        return inner
    from rlconnect.checkpoints.runner_format import CheckpointNotFoundError

    if not os.path.exists(root):
        raise CheckpointNotFoundError(f"{root!r} does not exist")
    raise CheckpointNotFoundError(
        f"{root!r} is neither a runner checkpoint (a folder with manifest.json) nor a run "
        f"folder (with {RUN_CHECKPOINT}/manifest.json)"
    )


def _from_runner(runner: Any, policy_id: str) -> PolicySource:
    ids = list(runner.policies)
    if policy_id not in runner.policies:
        raise _unknown_id(policy_id, ids)
    return PolicySource(
        policy_id,
        runner.policies[policy_id],
        runner.agent_pipeline(policy_id),
        runner.action_pipeline(policy_id),
    )


def _from_checkpoint(path: str | os.PathLike[str], policy_id: str) -> PolicySource:
    from rlconnect.checkpoints.runner_load import load_checkpoint
    from rlconnect.checkpoints.runner_restore import rebuild_policy

    ck = load_checkpoint(find_checkpoint(path))
    if policy_id not in ck.policies:
        raise _unknown_id(policy_id, list(ck.policies))
    rec = ck.policies[policy_id]
    if rec.kind is None:
        from rlconnect.errors import ExportError

        raise ExportError(
            f"checkpoint {ck.path!r}: policy {policy_id!r} is of an unregistered class and "
            "cannot be rebuilt by name: register its class with rc.register_policy(name, "
            "cls) before saving, or export the live runner with rc.export_onnx"
        )
    policy = rebuild_policy(ck, rec)
    ctx = ConnectorContext.from_policy(
        policy, observation_space=rec.env_observation_space, policy_id=policy_id
    )
    ctx.action_space = rec.env_action_space
    ctx.is_training = False
    action_ctx = attrs.evolve(ctx, config={}, initial_states=list(ctx.initial_states))
    agent = load_pipeline(rec.agent_pipeline_file, ctx)
    action = load_pipeline(rec.action_pipeline_file, action_ctx)
    if not isinstance(agent, AgentConnectorPipeline) or not isinstance(
        action, ActionConnectorPipeline
    ):
        raise CheckpointError(f"checkpoint {ck.path!r}: policy {policy_id!r}: pipelines swapped")
    return PolicySource(policy_id, policy, agent, cast(ActionConnectorPipeline, action))


def resolve(source: Any, policy_id: str) -> PolicySource:
    """The policy ``policy_id`` of ``source`` (see the module docstring); KeyError naming
    the ids there are when it has no such policy."""
    if isinstance(source, str | os.PathLike):
        return _from_checkpoint(source, policy_id)
    runner = getattr(source, "local_runner", source)  # a RunnerGroup acts through it
    if not (hasattr(runner, "policies") and hasattr(runner, "agent_pipeline")):
        raise TypeError(
            "source must be an EnvRunner, a RunnerGroup, or the path of a runner checkpoint "
            f"or run folder; got {type(source).__name__}"
        )
    return _from_runner(runner, policy_id)
