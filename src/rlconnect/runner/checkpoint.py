"""Runner checkpoints: save, verify and load policies (spec, weights) and their pipelines.

``save_checkpoint(runner, path)`` writes the folder described in
:mod:`rlconnect.runner.checkpoint_format` atomically. ``load_checkpoint(path)`` verifies
everything (manifest schema, paths, sizes, SHA-256 of every file, weights parsed from the
verified bytes, spaces decoded) before anything is built; nothing in a checkpoint can run
code: policies and connectors are rebuilt only through their registries, by name.
``restore_runner`` and ``runner_from_checkpoint`` check that the checkpoint fits (policy
ids, spaces, weight names and shapes) before they change anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import attrs
import numpy as np
import tree

from rlconnect.checkpoints import save_nest, save_pipeline
from rlconnect.checkpoints.pipelines import load_pipeline
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
    LearnerConnectorPipeline,
)
from rlconnect.connectors.pipeline import ConnectorPipeline
from rlconnect.errors import CheckpointError
from rlconnect.policy import Policy, policy_from_spec, policy_kind, registered_policies
from rlconnect.runner.checkpoint_format import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    FILE_ROLES,
    policy_folder,
    sha256_hex,
    write_folder_atomically,
)
from rlconnect.runner.checkpoint_load import (
    WEIGHTS_FORMAT,
    LoadedCheckpoint,
    PolicyRecord,
    load_checkpoint,
)
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.pipelines import PolicyPipelines
from rlconnect.spaces import describe_space, space_to_json


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
    "CheckpointMismatchError",
    "LoadedCheckpoint",
    "PolicyRecord",
    "load_checkpoint",
    "restore_runner",
    "runner_from_checkpoint",
    "save_checkpoint",
]

_FILE_NAMES = {
    "weights": "weights.safetensors",
    "agent_pipeline": "agent_pipeline",
    "action_pipeline": "action_pipeline",
    "learner_pipeline": "learner_pipeline",
}
_PIPELINE_KINDS: dict[str, type[ConnectorPipeline]] = {
    "agent": AgentConnectorPipeline,
    "action": ActionConnectorPipeline,
    "learner": LearnerConnectorPipeline,
}


class CheckpointMismatchError(CheckpointError, ValueError):
    """A sound checkpoint does not fit the runner (policy ids, spaces, architecture)."""


# -- saving ---------------------------------------------------------------------------------


def save_checkpoint(runner: CheckpointedRunner, path: str | os.PathLike[str]) -> None:
    """Write ``runner``'s policies (spec, weights) and pipelines atomically to ``path``."""
    import rlconnect

    config, omitted = _config_json(runner.config)
    specs = [_policy_spec(runner, pid, i) for i, pid in enumerate(runner.policies)]

    def fill(tmp: str) -> None:
        entries = []
        for (pid, folder, spec), policy in zip(specs, runner.policies.values()):
            os.makedirs(os.path.join(tmp, "policies", folder))
            files = {}
            for role in FILE_ROLES:
                rel = f"policies/{folder}/{_FILE_NAMES[role]}"
                full = os.path.join(tmp, *rel.split("/"))
                _write_role(runner, pid, policy, role, full)
                with open(full, "rb") as f:
                    data = f.read()
                files[role] = {"path": rel, "sha256": sha256_hex(data), "size": len(data)}
            entries.append({"id": pid, **spec, "weights_seq": policy.weights_seq, "files": files})
        manifest = {
            "format": CHECKPOINT_FORMAT,
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "rlconnect_version": rlconnect.__version__,
            "config": config,
            "config_omitted": omitted,
            "policies": entries,
        }
        text = json.dumps(manifest, indent=2, allow_nan=False)
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")

    write_folder_atomically(path, fill)


def _write_role(runner: CheckpointedRunner, pid: str, policy: Policy, role: str, full: str) -> None:
    if role == "weights":
        weights = {k: np.asarray(v) for k, v in policy.get_weights().items()}
        save_nest(
            full,
            {"weights": weights},
            format_name=WEIGHTS_FORMAT,
            format_version=1,
            where=f"policy {pid!r} weights",
        )
    elif role == "agent_pipeline":
        save_pipeline(runner.agent_pipeline(pid), full)
    elif role == "action_pipeline":
        save_pipeline(runner.action_pipeline(pid), full)
    else:
        save_pipeline(runner.learner_pipeline(pid), full)


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


def _policy_spec(
    runner: CheckpointedRunner, pid: str, index: int
) -> tuple[str, str, dict[str, Any]]:
    policy = runner.policies[pid]
    kwargs = policy.get_config()
    try:
        json.dumps(kwargs, allow_nan=False)
        spaces = {
            "observation_space": space_to_json(policy.observation_space),
            "action_space": space_to_json(policy.action_space),
        }
        env_spaces = {
            "env_observation_space": space_to_json(runner.agent_pipeline(pid).input_space),
            "env_action_space": space_to_json(runner.action_pipeline(pid).input_space),
        }
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot save policy {pid!r}: {exc}") from exc
    spec = {"kind": policy_kind(policy), "kwargs": kwargs, **spaces}
    return pid, policy_folder(pid, index), {"spec": spec, **env_spaces}


# -- loading --------------------------------------------------------------------------------


# -- fitting a checkpoint to a runner -------------------------------------------------------


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


def _check_fit(ck: LoadedCheckpoint, runner: CheckpointedRunner) -> None:
    _check_ids(ck, list(runner.policies))
    for pid, rec in ck.policies.items():
        policy = runner.policies[pid]
        _check_space(ck, pid, "observation space", rec.observation_space, policy.observation_space)
        _check_space(ck, pid, "action space", rec.action_space, policy.action_space)
        _check_space(
            ck,
            pid,
            "env observation space",
            rec.env_observation_space,
            runner.agent_pipeline(pid).input_space,
        )
        _check_space(
            ck,
            pid,
            "env action space",
            rec.env_action_space,
            runner.action_pipeline(pid).input_space,
        )
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


def _load_pipe(
    ck: LoadedCheckpoint, pid: str, role: str, file: str | None, live: ConnectorPipeline
) -> ConnectorPipeline:
    ctx = attrs.evolve(
        live.ctx, config=dict(live.ctx.config), initial_states=list(live.ctx.initial_states)
    )
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


def restore_runner(runner: CheckpointedRunner, path: str | os.PathLike[str]) -> None:
    """Load weights and pipelines (with statistics) from ``path`` into ``runner``.

    Everything is verified and checked against the runner first; on any error the runner
    is unchanged. A live pipeline with the saved one's members (names, kinds and
    parameters) keeps its objects and takes the saved statistics, so episodes still running
    keep their per-episode state (RNN state, frame stacks, previous actions). A pipeline
    that differs is replaced by the saved one (in the runner's current mode); fetch it again
    with ``runner.agent_pipeline(pid)``.
    """
    ck = load_checkpoint(path)
    _check_fit(ck, runner)
    agent: dict[str, AgentConnectorPipeline] = {}
    action: dict[str, ActionConnectorPipeline] = {}
    learner: dict[str, LearnerConnectorPipeline] = {}
    for pid, rec in ck.policies.items():
        learner[pid] = cast(
            LearnerConnectorPipeline,
            _load_pipe(ck, pid, "learner", rec.learner_pipeline_file, runner.learner_pipeline(pid)),
        )
        _check_learner(ck, pid, learner[pid], runner.policies[pid])
        agent[pid] = cast(
            AgentConnectorPipeline,
            _load_pipe(ck, pid, "agent", rec.agent_pipeline_file, runner.agent_pipeline(pid)),
        )
        action[pid] = cast(
            ActionConnectorPipeline,
            _load_pipe(ck, pid, "action", rec.action_pipeline_file, runner.action_pipeline(pid)),
        )
        _check_pipe_output(ck, pid, agent[pid], runner.policies[pid].observation_space)
    pipes = runner.pipelines
    for pid, rec in ck.policies.items():
        _load_weights(runner.policies[pid], rec)
        kinds = ((pipes.agent, agent), (pipes.action, action), (pipes.learner, learner))
        for live, loaded in kinds:
            if _same_members(live[pid], loaded[pid]):
                live[pid].set_statistics(loaded[pid].get_statistics())
            else:
                live[pid] = loaded[pid]  # type: ignore[assignment]


def _check_learner(
    ck: LoadedCheckpoint, pid: str, pipe: LearnerConnectorPipeline, policy: Policy
) -> None:
    """A saved learner pipeline must be able to run with the policy it is restored for."""
    try:
        pipe.check_policy(policy)
    except ValueError as exc:
        raise _mismatch(ck, f"policy {pid!r}: the saved learner pipeline: {exc}") from None


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


def _build_policy(ck: LoadedCheckpoint, rec: PolicyRecord) -> Policy:
    """The policy of ``rec``, its saved weights set once (with their saved version: a
    restore is no new version); the weights its config declares are checked against them
    first, so a config edited to declare a huge network is refused before anything is
    built."""
    known = registered_policies()
    if rec.kind is None or rec.kind not in known:
        what = "of an unregistered class" if rec.kind is None else f"of kind {rec.kind!r}"
        raise CheckpointError(
            f"checkpoint {ck.path!r}: policy {rec.policy_id!r} is {what}, which cannot be "
            f"rebuilt; registered kinds: {known}. Register its class with "
            "rc.register_policy(name, cls) (importing the module that does), or build the "
            "runner yourself and call runner.restore(path)"
        )
    try:
        policy = policy_from_spec(  # the declared weights are checked before it is built
            rec.kind, rec.observation_space, rec.action_space, rec.kwargs, weights=rec.weights
        )
    except Exception as exc:  # the class's own validation of the saved kwargs and weights
        raise CheckpointError(
            f"checkpoint {ck.path!r}: policy {rec.policy_id!r}: cannot rebuild {rec.kind} "
            f"from its saved spec and weights: {type(exc).__name__}: {exc}"
        ) from None
    policy.weights_seq = rec.weights_seq
    return policy


def _learner_loader(
    ck: LoadedCheckpoint, rec: PolicyRecord
) -> Callable[[ConnectorContext], ConnectorPipeline]:
    file = rec.learner_pipeline_file

    def load(ctx: ConnectorContext) -> ConnectorPipeline:
        if file is None:  # a checkpoint from before learner pipelines
            return LearnerConnectorPipeline(ctx)
        pipe = load_pipeline(file, ctx)
        _check_kind(ck, rec.policy_id, "learner", file, pipe)
        return pipe

    return load


def _pipeline_loader(
    ck: LoadedCheckpoint, rec: PolicyRecord, role: str
) -> Callable[[ConnectorContext], ConnectorPipeline]:
    file = rec.agent_pipeline_file if role == "agent" else rec.action_pipeline_file
    saved = rec.env_observation_space if role == "agent" else rec.env_action_space

    def load(ctx: ConnectorContext) -> ConnectorPipeline:
        live = ctx.observation_space if role == "agent" else ctx.action_space
        what = "env observation space" if role == "agent" else "env action space"
        _check_space(ck, rec.policy_id, what, saved, live)
        pipe = load_pipeline(file, ctx)
        _check_kind(ck, rec.policy_id, role, file, pipe)
        if role == "agent":  # before the runner's own check raises a plain ValueError
            _check_pipe_output(ck, rec.policy_id, pipe, rec.observation_space)
        return pipe

    return load


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
    config = ck.runner_config(config_overrides)
    policies = {pid: _build_policy(ck, rec) for pid, rec in ck.policies.items()}
    return cls(
        env,
        policies,
        policy_mapping_fn=policy_mapping_fn,
        config=config,
        callbacks=callbacks,
        agent_pipelines={pid: _pipeline_loader(ck, r, "agent") for pid, r in ck.policies.items()},
        action_pipelines={pid: _pipeline_loader(ck, r, "action") for pid, r in ck.policies.items()},
        learner_pipelines={pid: _learner_loader(ck, r) for pid, r in ck.policies.items()},
    )
