"""Fitting a verified runner checkpoint to live policies and pipelines, or building them.

``restore_policies(ck, live)`` checks that the checkpoint fits the live policies (policy
ids, spaces, weight names and shapes, pipeline kinds and outputs) before it changes
anything, then sets the saved weights and statistics. ``build_policies(ck)`` and
``pipeline_loaders(ck)`` rebuild them from nothing, for a new runner. Policies and
connectors are rebuilt only through their registries, by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
import tree

from rlconnect.checkpoints.pipelines import load_pipeline
from rlconnect.checkpoints.runner_load import LoadedCheckpoint, PolicyRecord
from rlconnect.connectors.learner import LearnerConnectorPipeline
from rlconnect.connectors.pipeline import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
)
from rlconnect.errors import CheckpointError
from rlconnect.policy import Policy, UnknownPolicyError, policy_from_spec, registered_policies
from rlconnect.spaces import describe_space

__all__ = [
    "CheckpointMismatchError",
    "LivePolicy",
    "PipelineLoader",
    "build_policies",
    "pipeline_loaders",
    "rebuild_policy",
    "restore_policies",
]

PipelineLoader = Callable[[Any], ConnectorPipeline]
"""Builds a saved pipeline for a connector context."""

_PIPELINE_KINDS: dict[str, type[ConnectorPipeline]] = {
    "agent": AgentConnectorPipeline,
    "action": ActionConnectorPipeline,
    "learner": LearnerConnectorPipeline,
}


class CheckpointMismatchError(CheckpointError, ValueError):
    """A sound checkpoint does not fit the runner (policy ids, spaces, architecture)."""


@attrs.frozen
class LivePolicy:
    """One of a runner's policies with its three pipelines: what a restore fits the
    checkpoint to, and what it hands back for the runner to hold."""

    policy: Policy
    agent: AgentConnectorPipeline
    action: ActionConnectorPipeline
    learner: LearnerConnectorPipeline

    def pipeline(self, role: str) -> ConnectorPipeline:
        """The pipeline of ``role``: ``"agent"``, ``"action"`` or ``"learner"``."""
        return getattr(self, role)


# -- fitting a checkpoint to live policies --------------------------------------------------


def _mismatch(ck: LoadedCheckpoint, msg: str) -> CheckpointMismatchError:
    return CheckpointMismatchError(f"checkpoint {ck.path!r} does not fit this runner: {msg}")


def _check_ids(ck: LoadedCheckpoint, runner_ids: list[str]) -> None:
    only_ck = [p for p in ck.policies if p not in runner_ids]
    only_runner = [p for p in runner_ids if p not in ck.policies]
    if only_ck or only_runner:
        raise _mismatch(
            ck,
            f"policy ids differ: checkpoint has {list(ck.policies)}, runner has {runner_ids} "
            f"(unknown to the runner: {only_ck}; missing from the checkpoint: {only_runner})",
        )


def _check_space(ck: LoadedCheckpoint, pid: str, what: str, saved: Any, live: Any) -> None:
    if saved != live:
        raise _mismatch(
            ck,
            f"policy {pid!r}: {what} differs: checkpoint {describe_space(saved)}, "
            f"runner {describe_space(live)}",
        )


def _check_architecture(ck: LoadedCheckpoint, pid: str, policy: Policy) -> None:
    live = {k: tuple(np.shape(v)) for k, v in policy.get_weights().items()}
    saved = {k: tuple(v.shape) for k, v in ck.policies[pid].weights.items()}
    if live == saved:
        return
    parts = []
    if sorted(set(saved) - set(live)):
        parts.append(f"only in the checkpoint: {sorted(set(saved) - set(live))}")
    if sorted(set(live) - set(saved)):
        parts.append(f"only in the runner: {sorted(set(live) - set(saved))}")
    shapes = {k: (saved[k], live[k]) for k in saved if k in live and saved[k] != live[k]}
    if shapes:
        shown = ", ".join(f"{k!r}: checkpoint {a}, runner {b}" for k, (a, b) in shapes.items())
        parts.append(f"shapes differ: {shown}")
    raise _mismatch(ck, f"policy {pid!r}: different architecture (weights {'; '.join(parts)})")


def _check_fit(ck: LoadedCheckpoint, live: Mapping[str, LivePolicy]) -> None:
    _check_ids(ck, list(live))
    for pid, rec in ck.policies.items():
        policy = live[pid].policy
        _check_space(ck, pid, "observation space", rec.observation_space, policy.observation_space)
        _check_space(ck, pid, "action space", rec.action_space, policy.action_space)
        env_obs, env_act = live[pid].agent.input_space, live[pid].action.input_space
        _check_space(ck, pid, "env observation space", rec.env_observation_space, env_obs)
        _check_space(ck, pid, "env action space", rec.env_action_space, env_act)
        _check_architecture(ck, pid, policy)


def _check_kind(
    ck: LoadedCheckpoint, pid: str, role: str, file: str, pipe: ConnectorPipeline
) -> None:
    """The agent pipeline's file must hold an agent pipeline (the action one's an action
    pipeline, the learner one's a learner pipeline): files swapped in a checkpoint are
    refused, never installed."""
    want = _PIPELINE_KINDS[role]
    if not isinstance(pipe, want):
        raise _mismatch(
            ck,
            f"policy {pid!r}: {os.path.basename(file)} holds an {type(pipe).__name__}, "
            f"not an {want.__name__}",
        )


def _file(rec: PolicyRecord, role: str) -> str | None:
    return getattr(rec, f"{role}_pipeline_file")


def _load_pipe(
    ck: LoadedCheckpoint, pid: str, role: str, live: ConnectorPipeline
) -> ConnectorPipeline:
    ctx = attrs.evolve(
        live.ctx, config=dict(live.ctx.config), initial_states=list(live.ctx.initial_states)
    )
    file = _file(ck.policies[pid], role)
    if file is None:  # a checkpoint from before learner pipelines: an empty one
        return LearnerConnectorPipeline(ctx)
    pipe = load_pipeline(file, ctx)
    _check_kind(ck, pid, role, file, pipe)
    if not live.is_training:
        pipe.in_eval()
    if live.consumer is not None:  # edits of the restored pipeline stay checked
        pipe.feeds(*live.consumer)
    return pipe


def _check_pipe_output(ck: LoadedCheckpoint, pid: str, pipe: Any, want: Any) -> None:
    out = pipe.output_space
    if (getattr(out, "shape", None), getattr(out, "dtype", None)) != (
        getattr(want, "shape", None),
        getattr(want, "dtype", None),
    ):
        raise _mismatch(
            ck,
            f"policy {pid!r}: the saved agent pipeline outputs {describe_space(out)} but the "
            f"policy expects {describe_space(want)}",
        )


def _check_learner(ck: LoadedCheckpoint, pid: str, pipe: ConnectorPipeline, policy: Policy) -> None:
    """A saved learner pipeline must be able to run with the policy it is restored for."""
    try:
        pipe.check_policy(policy)  # type: ignore[attr-defined]
    except ValueError as exc:
        raise _mismatch(ck, f"policy {pid!r}: the saved learner pipeline: {exc}") from None


def _loaded(ck: LoadedCheckpoint, pid: str, live: LivePolicy) -> dict[str, ConnectorPipeline]:
    """The saved pipelines of ``pid``, built for the live ones' contexts and checked."""
    learner = _load_pipe(ck, pid, "learner", live.learner)
    _check_learner(ck, pid, learner, live.policy)
    out = {"learner": learner}
    for role in ("agent", "action"):
        out[role] = _load_pipe(ck, pid, role, live.pipeline(role))
    _check_pipe_output(ck, pid, out["agent"], live.policy.observation_space)
    return out


def restore_policies(ck: LoadedCheckpoint, live: Mapping[str, LivePolicy]) -> dict[str, LivePolicy]:
    """Set the saved weights and statistics of ``ck`` in the ``live`` policies; the
    pipelines the runner holds from now on, by policy id.

    Everything is checked against ``live`` first; on any error nothing has changed. A live
    pipeline with the saved one's members (names, kinds and parameters) keeps its object
    and takes the saved statistics, so episodes still running keep their per-episode state
    (RNN state, frame stacks, previous actions). A pipeline that differs is replaced by the
    saved one (in the live one's mode)."""
    _check_fit(ck, live)
    loaded = {pid: _loaded(ck, pid, live[pid]) for pid in ck.policies}
    out = {}
    for pid, rec in ck.policies.items():
        _load_weights(live[pid].policy, rec)
        held = {}
        for role, saved in loaded[pid].items():
            current = live[pid].pipeline(role)
            if _same_members(current, saved):
                current.set_statistics(saved.get_statistics())
                held[role] = current
            else:
                held[role] = saved
        out[pid] = LivePolicy(live[pid].policy, **held)  # type: ignore[arg-type]
    return out


def _load_weights(policy: Policy, rec: PolicyRecord) -> None:
    """The saved weights and their saved version: a restore is no new version."""
    policy.set_weights(rec.weights)
    policy.weights_seq = rec.weights_seq


def _same_members(a: ConnectorPipeline, b: ConnectorPipeline) -> bool:
    """Whether two pipelines have the same members: names, kinds and parameters."""
    if a.names != b.names:
        return False
    for (_, x), (_, y) in zip(a.items(), b.items(), strict=True):
        if type(x) is not type(y) or x.params.keys() != y.params.keys():
            return False
        for key, value in x.params.items():
            try:
                tree.assert_same_structure(value, y.params[key])
            except (TypeError, ValueError):
                return False
            pairs = zip(tree.flatten(value), tree.flatten(y.params[key]), strict=True)
            if not all(np.array_equal(u, v) for u, v in pairs):
                return False
    return True


# -- rebuilding from nothing ----------------------------------------------------------------


def rebuild_policy(ck: LoadedCheckpoint, rec: PolicyRecord) -> Policy:
    """The policy of ``rec``, rebuilt by kind through the policy registry, its saved
    weights set once (with their saved version: a restore is no new version); the weights
    its config declares are checked against them first, so a config edited to declare a
    huge network is refused before anything is built. ``UnknownPolicyError`` for a kind
    that is not registered, ``CheckpointError`` for a spec its class refuses."""
    assert rec.kind is not None, "a policy of an unregistered class is refused by the caller"
    try:
        policy = policy_from_spec(  # the declared weights are checked before it is built
            rec.kind, rec.observation_space, rec.action_space, rec.kwargs, weights=rec.weights
        )
    except UnknownPolicyError:
        raise
    except Exception as exc:  # the class's own validation of the saved kwargs and weights
        raise CheckpointError(
            f"checkpoint {ck.path!r}: policy {rec.policy_id!r}: cannot rebuild {rec.kind} "
            f"from its saved spec and weights: {type(exc).__name__}: {exc}"
        ) from None
    policy.weights_seq = rec.weights_seq
    return policy


def _build_policy(ck: LoadedCheckpoint, rec: PolicyRecord) -> Policy:
    """``rebuild_policy``, once the kind is known to be registered (else a
    ``CheckpointError`` saying how to register it, or to restore into a runner)."""
    known = registered_policies()
    if rec.kind is None or rec.kind not in known:
        what = "of an unregistered class" if rec.kind is None else f"of kind {rec.kind!r}"
        raise CheckpointError(
            f"checkpoint {ck.path!r}: policy {rec.policy_id!r} is {what}, which cannot be "
            f"rebuilt; registered kinds: {known}. Register its class with "
            "rc.register_policy(name, cls) (importing the module that does), or build the "
            "runner yourself and call runner.restore(path)"
        )
    return rebuild_policy(ck, rec)


def build_policies(ck: LoadedCheckpoint) -> dict[str, Policy]:
    """Every policy of ``ck``, rebuilt by kind through the policy registry."""
    return {pid: _build_policy(ck, rec) for pid, rec in ck.policies.items()}


def _loader(ck: LoadedCheckpoint, rec: PolicyRecord, role: str) -> PipelineLoader:
    file = _file(rec, role)
    saved = rec.env_observation_space if role == "agent" else rec.env_action_space

    def load(ctx: Any) -> ConnectorPipeline:
        if role != "learner":
            live = ctx.observation_space if role == "agent" else ctx.action_space
            what = "env observation space" if role == "agent" else "env action space"
            _check_space(ck, rec.policy_id, what, saved, live)
        if file is None:  # a checkpoint from before learner pipelines
            return LearnerConnectorPipeline(ctx)
        pipe = load_pipeline(file, ctx)
        _check_kind(ck, rec.policy_id, role, file, pipe)
        if role == "agent":  # before the runner's own check raises a plain ValueError
            _check_pipe_output(ck, rec.policy_id, pipe, rec.observation_space)
        return pipe

    return load


def pipeline_loaders(ck: LoadedCheckpoint) -> dict[str, dict[str, PipelineLoader]]:
    """For each role (``"agent"``, ``"action"``, ``"learner"``), a loader of each policy's
    saved pipeline for the new runner's connector context, checked as it is built."""
    return {
        role: {pid: _loader(ck, rec, role) for pid, rec in ck.policies.items()}
        for role in _PIPELINE_KINDS
    }
