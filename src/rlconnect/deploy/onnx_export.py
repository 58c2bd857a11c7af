"""``export_onnx``: one ONNX model from the raw observation to the env action.

The graph is the agent pipeline's ONNX forms (``rlconnect.deploy.onnx_forms``), the
policy's torch model, the mode of its action distribution, and the action pipeline's
forms, traced with ``torch.onnx`` (the TorchScript exporter: it needs no extra package and
takes a fraction of a second) and checked with onnxruntime against the traced torch module
before anything is written. The batch axis is dynamic.

Inputs: ``obs`` (the raw observation, the env's dtype), ``state_in_0 ...``; outputs:
``actions`` (the env action) and ``state_out_0 ...``, the states to feed back at the next
step of the same episode. A Dict or Tuple observation is one input per part instead of
``obs``, in the space's order, named by its path: ``obs.pos`` for ``obs["pos"]``, ``obs.1``
for ``obs[1]``, ``obs.arm.angle`` nested (each entry's ``path`` in the metadata gives the
keys and indices); the graph flattens them as ``FlattenObservations`` does, so the
agent pipeline must flatten the observation before the model.
``metadata_props["rlconnect"]`` describes them as JSON, with the model's digest
(``model_sha256``, see ``onnx_file``)::

    {"inputs": [{"name": "obs", "shape": ["batch", 4], "dtype": "float32",
                 "meaning": "...", "initial": null}, ...],
     "outputs": [...], "observation_space": {...}, "action_space": {...},
     "policy_id": "default_policy", "pipelines": {"agent": [...], "action": [...]},
     "model_sha256": "<64 hex digits>"}

where ``initial`` is each state's value at an episode's start (one row, nested lists).
"""

from __future__ import annotations

import copy
import functools
import io
import json
import os
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.deploy.onnx_file import DIGEST_KEY, METADATA_KEY, model_digest, read_onnx_model
from rlconnect.deploy.onnx_forms import ConnectorForm, StateSpec, form_of
from rlconnect.deploy.sources import PolicySource
from rlconnect.errors import ExportError
from rlconnect.policy.distributions import ActionDistSpec
from rlconnect.policy.torch_policy import TorchPolicy
from rlconnect.spaces import describe_space, space_to_json

__all__ = ["OnnxPolicy", "obs_input_name", "obs_parts", "write_onnx"]

_LEAF_OBS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)

ObsPart = tuple[tuple[str | int, ...], gym.Space]


def obs_parts(space: gym.Space, path: tuple[str | int, ...] = ()) -> list[ObsPart]:
    """``(path, leaf space)`` of each array the graph takes for an observation of
    ``space``, in the space's order: one part with path ``()`` for a Box, Discrete,
    MultiDiscrete or MultiBinary space, one per leaf of a Dict or Tuple (keys and indices
    in its path). ExportError for a space with another part (Text, Graph, Sequence)."""
    if isinstance(space, gym.spaces.Dict):
        return [p for k, s in space.spaces.items() for p in obs_parts(s, (*path, k))]
    if isinstance(space, gym.spaces.Tuple):
        return [p for i, s in enumerate(space.spaces) for p in obs_parts(s, (*path, i))]
    if isinstance(space, _LEAF_OBS):
        return [(path, space)]
    where = "".join(f"[{k!r}]" for k in path)
    raise ExportError(
        f"the observation part obs{where}, {describe_space(space)}, has no ONNX input (the "
        "graph takes Box, Discrete, MultiDiscrete and MultiBinary parts), so nothing was "
        "written; deploy this policy with rc.export_policy and rc.load_policy"
    )


def obs_input_name(path: tuple[str | int, ...]) -> str:
    """The graph input of the observation part at ``path``: ``obs``, ``obs.pos``, ``obs.1``."""
    return ".".join(["obs", *map(str, path)])


def _nest(space: gym.Space, parts: Iterator[torch.Tensor]) -> Any:
    """The observation nest of ``space`` from its parts, in :func:`obs_parts`' order."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _nest(s, parts) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_nest(s, parts) for s in space.spaces)
    return next(parts)


def _mode(dist: ActionDistSpec, dist_inputs: torch.Tensor) -> torch.Tensor:
    """The distribution's mode in the env's layout (``TorchPolicy`` with explore=False)."""
    b = dist_inputs.shape[0]
    if dist.kind == "gaussian":
        return dist_inputs[:, : dist.dim].reshape(b, *dist.action_shape).to(torch.float32)
    if dist.kind == "categorical":
        return torch.argmax(dist_inputs, dim=1) + int(dist.start)
    parts = torch.split(dist_inputs, dist.nvec, dim=1)
    idx = torch.stack([torch.argmax(p, dim=1) for p in parts], dim=1)
    start = torch.from_numpy(np.asarray(dist.start, np.int64).reshape(-1))
    return (idx + start).reshape(b, *dist.action_shape)


class OnnxPolicy(nn.Module):
    """Agent forms -> model -> distribution mode -> action forms, with explicit states."""

    def __init__(
        self,
        policy: TorchPolicy,
        agent: list[ConnectorForm],
        action: list[ConnectorForm],
        obs_space: gym.Space,
    ) -> None:
        super().__init__()
        self.obs_space = obs_space
        self.num_obs = len(obs_parts(obs_space))
        self.model = policy.model
        self.dist = policy.dist
        self.recurrent = policy.is_recurrent()
        self.num_states = policy.num_state_tensors()
        self.agent = nn.ModuleList(agent)  # registers them; the list keeps their type
        self.agent_forms = agent
        self.action = nn.ModuleList(action)
        self.counts = [len(f.state_specs()) for f in agent]
        self.reads_rewards = any(f.reads_rewards for f in agent)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``inputs`` are the observation's leaves, then the rewards (when a form reads
        them), then the forms' states; returns the actions and the forms' next states."""
        states = list(inputs[self.num_obs :])
        cols: dict[str, Any] = {"obs": _nest(self.obs_space, iter(inputs[: self.num_obs]))}
        if self.reads_rewards:
            cols["rewards"] = states.pop(0).to(torch.float64)
        member_states, at = [], 0
        for form, n in zip(self.agent_forms, self.counts):
            cols, new = form(cols, states[at : at + n])
            member_states.append(new)
            at += n
        x = cols["obs"].to(torch.float32)
        if self.recurrent:
            state_in = [cols[f"state_in_{i}"].to(torch.float32) for i in range(self.num_states)]
            out = self.model(x, state_in)
            dist_inputs, state_out = out[0], list(out[1])
        else:
            out = self.model(x)
            dist_inputs, state_out = (out[0] if isinstance(out, tuple) else out), []
        outputs = {"actions": _mode(self.dist, dist_inputs)}
        outputs.update({f"state_out_{i}": s for i, s in enumerate(state_out)})
        next_states = [
            s
            for form, new in zip(self.agent_forms, member_states)
            for s in form.after_policy(outputs, new)
        ]
        actions = outputs["actions"]
        for action_form in self.action:
            actions = action_form(actions)
        return (actions, *next_states)


def _forms(src: PolicySource) -> tuple[list[ConnectorForm], list[ConnectorForm]]:
    agent = [form_of(name, c) for name, c in src.agent_pipeline.items()]
    action = [form_of(name, c) for name, c in src.action_pipeline.items()]
    return agent, action


def _check_policy(src: PolicySource) -> TorchPolicy:
    policy = src.policy
    if not isinstance(policy, TorchPolicy):
        raise ExportError(
            f"policy {src.policy_id!r} is a {type(policy).__name__}, which has no ONNX form "
            "(only TorchPolicy models, MLPPolicy included, can be exported to ONNX)"
        )
    if type(policy).forward is not TorchPolicy.forward:
        raise ExportError(
            f"policy {src.policy_id!r}: {type(policy).__name__} overrides forward() to feed its "
            "model other columns, which has no ONNX form; export a model called as "
            "model(obs) or model(obs, state)"
        )
    obs_parts(src.agent_pipeline.input_space)  # ExportError for a part with no input
    seen = src.agent_pipeline.output_space
    if not isinstance(seen, _LEAF_OBS):
        raise ExportError(
            f"policy {src.policy_id!r}: the agent pipeline gives the model "
            f"{describe_space(seen)} observations, but the ONNX graph feeds the model one "
            "array, so nothing was written; put FlattenObservations in the agent pipeline "
            "(the default pipeline has it for Dict and Tuple spaces), or deploy this policy "
            "as it is with rc.export_policy and rc.load_policy"
        )
    return policy


def _entry(name: str, shape: tuple, dtype: Any, meaning: str, initial: Any) -> dict[str, Any]:
    return {
        "name": name,
        "shape": ["batch", *map(int, shape)],
        "dtype": np.dtype(dtype).name,
        "meaning": meaning,
        "initial": None if initial is None else np.asarray(initial).tolist(),
    }


def _obs_entries(space: gym.Space, feeds: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The metadata of the observation inputs; a Dict or Tuple part also gives its
    ``path`` (keys and indices into the observation)."""
    out = []
    for path, _ in obs_parts(space):
        name, sample = obs_input_name(path), feeds[obs_input_name(path)]
        if not path:
            meaning = "the raw observation from the env"
            out.append(_entry(name, sample.shape[1:], sample.dtype, meaning, None))
            continue
        where = "".join(f"[{k!r}]" for k in path)
        meaning = f"the raw observation's part obs{where}"
        out.append(
            {**_entry(name, sample.shape[1:], sample.dtype, meaning, None), "path": list(path)}
        )
    return out


def _interface(
    src: PolicySource, specs: list[StateSpec], feeds: dict[str, np.ndarray]
) -> dict[str, Any]:
    entry = _entry
    obs = _obs_entries(src.agent_pipeline.input_space, feeds)
    states_in, states_out = [], []
    for i, spec in enumerate(specs):
        init = np.asarray(spec.initial)
        states_in.append(entry(f"state_in_{i}", init.shape, init.dtype, spec.meaning, init))
        states_out.append(
            entry(f"state_out_{i}", init.shape, init.dtype, f"next {spec.meaning}", None)
        )
    action_space = src.action_pipeline.input_space
    act = np.asarray(action_space.sample())
    actions = entry("actions", act.shape, act.dtype, "the env action (the mode)", None)
    return {
        "inputs": [*obs, *states_in],
        "outputs": [actions, *states_out],
        "observation_space": space_to_json(src.agent_pipeline.input_space),
        "action_space": space_to_json(action_space),
        "policy_id": src.policy_id,
        "pipelines": {"agent": src.agent_pipeline.names, "action": src.action_pipeline.names},
    }


def _state_specs(module: OnnxPolicy) -> list[StateSpec]:
    specs = [s for form in module.agent_forms for s in form.state_specs()]
    if module.reads_rewards:
        reward = StateSpec(
            "the reward received with obs (for the previous action; 0 at an episode's start); "
            "set it at every call, its output echoes it",
            np.array(0.0, np.float32),
        )
        specs.insert(0, reward)
    return specs


class _WithRewardEcho(nn.Module):
    """Returns the reward input as its state output, so every input has its output."""

    def __init__(self, inner: OnnxPolicy) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.inner(*inputs)
        if self.inner.reads_rewards:
            return (out[0], inputs[self.inner.num_obs] * 1, *out[1:])
        return out


def _trace(
    module: nn.Module, args: tuple, names_in: list[str], names_out: list[str], opset: Any
) -> bytes:
    buf = io.BytesIO()
    axes = {n: {0: "batch"} for n in names_in + names_out}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            args,
            buf,  # type: ignore[arg-type]  # a file object works as well as a path
            input_names=names_in,
            output_names=names_out,
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )
    return buf.getvalue()


def _check(data: bytes, module: nn.Module, feeds: dict[str, np.ndarray]) -> None:
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - the onnx extra is part of dev
        raise ImportError(
            "export_onnx checks the model with onnxruntime: pip install 'rlconnect[onnx]'"
        ) from None
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    with torch.inference_mode():
        want = module(*(torch.from_numpy(v) for v in feeds.values()))
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.numpy()
        ok = np.allclose(g, w, atol=1e-5) if g.dtype.kind == "f" else np.array_equal(g, w)
        if g.dtype != w.dtype or g.shape != w.shape or not ok:
            raise ExportError(
                f"the exported ONNX model disagrees with the torch module on output {i} "
                f"(onnxruntime {g.dtype}{g.shape}, torch {w.dtype}{w.shape}); nothing written"
            )


def _restore_unused_inputs(model: Any, inputs: list[dict[str, Any]]) -> None:
    """Declare the state inputs the exporter pruned because the graph never reads them
    (e.g. a previous action the model ignores): every state stays an input, in order."""
    import onnx

    graph = model.graph
    present = {i.name: i for i in graph.input}
    declared = []
    for entry in inputs:
        if entry["name"] in present:
            declared.append(present[entry["name"]])
            continue
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(entry["dtype"]))
        declared.append(onnx.helper.make_tensor_value_info(entry["name"], elem, entry["shape"]))
    del graph.input[:]
    graph.input.extend(declared)


def _example_feeds(obs_space: gym.Space, specs: list[StateSpec]) -> dict[str, np.ndarray]:
    """Three rows to trace and check with: sampled observations (from a copy of the space,
    so the env's own sampling stream is left alone) and every state's initial value."""
    space = copy.deepcopy(obs_space)
    space.seed(0)
    samples = [space.sample() for _ in range(3)]
    feeds = {}
    for path, _ in obs_parts(obs_space):
        rows = [functools.reduce(lambda x, k: x[k], path, s) for s in samples]
        feeds[obs_input_name(path)] = np.stack([np.asarray(r) for r in rows])
    for i, spec in enumerate(specs):
        init = np.asarray(spec.initial)
        feeds[f"state_in_{i}"] = np.broadcast_to(init, (3, *init.shape)).copy()
    return feeds


def write_onnx(
    src: PolicySource, path: str | os.PathLike[str], *, opset: int | None
) -> dict[str, Any]:
    """Export ``src`` to exactly ``path`` (see the module docstring); returns the interface."""
    import onnx

    policy = _check_policy(src)
    agent, action = _forms(src)
    obs_space = src.agent_pipeline.input_space
    inner = OnnxPolicy(policy, agent, action, obs_space).eval()
    module = _WithRewardEcho(inner).eval()
    specs = _state_specs(inner)
    feeds = _example_feeds(obs_space, specs)
    names_out = ["actions", *(f"state_out_{i}" for i in range(len(specs)))]
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    try:
        data = _trace(module, args, list(feeds), names_out, opset)
    except Exception as exc:  # the tracer or exporter met an operation without an ONNX form
        raise ExportError(
            f"policy {src.policy_id!r}: torch.onnx cannot export the model "
            f"{type(policy.model).__name__}: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    interface = _interface(src, specs, feeds)
    model = onnx.load_from_string(data)
    _restore_unused_inputs(model, interface["inputs"])
    interface[DIGEST_KEY] = model_digest(model, interface)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(interface)
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    read_onnx_model(data, os.fspath(path))  # the digest holds for the bytes to be written
    _check(data, module, feeds)
    atomic_write_bytes(path, data)
    return interface
