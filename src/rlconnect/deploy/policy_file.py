"""The exported policy file: one policy and its pipelines in one pickle-free file.

The file is the rlconnect container (``rlconnect.checkpoints.container``: a safetensors
file whose header holds the JSON structure and a SHA-256 digest over everything, checked
before anything is built) in format ``POLICY_FILE`` (``"rlconnect.policy"`` version 1,
``rlconnect.checkpoints.formats``), and this structure::

    {"policy_id": "default_policy", "rlconnect_version": "0.1.0",
     "observation_space": {...},     # what the env returns (the agent pipeline's input)
     "action_space": {...},          # what the env takes (the action pipeline's input)
     "policy": {"kind": "MLPPolicy", "config": {...get_config()...},
                "observation_space": {...}, "action_space": {...},
                "weights": {"pi.0.weight": {"__array__": "arr_0"}, ...}},
     "agent_pipeline": {...pipeline to_state(), statistics included...},
     "action_pipeline": {...}}

Spaces use the JSON codec of ``rlconnect.spaces``; pipelines are rebuilt only through the
connector registry and policies only through the policy registry, by name.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from rlconnect._version import __version__
from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.container import content_digest, pack, unpack
from rlconnect.checkpoints.files import read_regular_file
from rlconnect.checkpoints.formats import POLICY_FILE
from rlconnect.checkpoints.nest import encode_nest
from rlconnect.checkpoints.pipelines import check_pipeline_state
from rlconnect.deploy.sources import PolicySource
from rlconnect.errors import CheckpointError, ExportError
from rlconnect.policy import policy_kind
from rlconnect.spaces import describe_space, space_from_json, space_to_json

__all__ = [
    "PolicyFile",
    "describe_policy_file",
    "read_policy_file",
    "write_policy_file",
]


@attrs.define
class PolicyFile:
    """A verified policy file: spaces decoded, everything else as saved (nothing built)."""

    path: str
    policy_id: str
    observation_space: gym.Space
    action_space: gym.Space
    kind: str
    config: dict[str, Any]
    policy_observation_space: gym.Space
    policy_action_space: gym.Space
    weights: dict[str, np.ndarray]
    agent_pipeline: dict[str, Any]
    action_pipeline: dict[str, Any]
    rlconnect_version: str
    size: int
    sha256: str


def _structure(src: PolicySource) -> dict[str, Any]:
    kind = policy_kind(src.policy)
    if kind is None:
        raise ExportError(
            f"policy {src.policy_id!r} is a {type(src.policy).__name__}, a kind that cannot be "
            "rebuilt by name; register its class with rc.register_policy(name, cls) (its "
            "get_config() must return its constructor arguments), or export its network "
            "with rc.export_onnx, which takes any TorchPolicy model torch can export"
        )
    config = src.policy.get_config()
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ExportError(f"policy {src.policy_id!r}: get_config() is not JSON: {exc}") from None
    return {
        "policy_id": src.policy_id,
        "rlconnect_version": __version__,
        "observation_space": space_to_json(src.agent_pipeline.input_space),
        "action_space": space_to_json(src.action_pipeline.input_space),
        "policy": {
            "kind": kind,
            "config": config,
            "observation_space": space_to_json(src.policy.observation_space),
            "action_space": space_to_json(src.policy.action_space),
            "weights": {k: np.asarray(v) for k, v in src.policy.get_weights().items()},
        },
        "agent_pipeline": src.agent_pipeline.to_state(),
        "action_pipeline": src.action_pipeline.to_state(),
    }


def write_policy_file(src: PolicySource, path: str | os.PathLike[str]) -> int:
    """Write ``src`` to exactly ``path`` atomically; returns the file's size in bytes.
    Everything is encoded in memory first, so a failed export writes nothing."""
    try:
        obj, arrays = encode_nest(_structure(src), where=f"policy {src.policy_id!r}")
    except (TypeError, ValueError) as exc:
        raise ExportError(f"cannot export policy {src.policy_id!r}: {exc}") from None
    data = pack(obj, arrays, POLICY_FILE)
    atomic_write_bytes(path, data)
    return len(data)


def _space(obj: Any, where: str, fail: Any) -> gym.Space:
    try:
        return space_from_json(obj)
    except Exception as exc:  # the codec validates hostile input; any failure is a defect
        raise fail(f"invalid {where}: {exc}") from None


def _get(obj: dict[str, Any], key: str, kind: type, fail: Any) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind):
        raise fail(f"{key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def read_policy_file(path: str | os.PathLike[str]) -> PolicyFile:
    """Read and verify an exported policy file (digest, structure, spaces); build nothing.

    Only a regular file of at most ``checkpoints.files.MAX_FILE_BYTES`` is read. Raises
    ``CheckpointError`` for any defect (a folder, a FIFO or a device included),
    ``FileNotFoundError`` for a missing file."""
    source = os.fspath(path)

    def fail(msg: str) -> CheckpointError:
        return CheckpointError(f"cannot load policy file {source!r}: {msg}")

    data = read_regular_file(source, fail=fail)
    _, obj = unpack(data, POLICY_FILE, source=source)

    if not isinstance(obj, dict):
        raise fail("the structure is not an object")
    policy = _get(obj, "policy", dict, fail)
    weights = _get(policy, "weights", dict, fail)
    if not all(isinstance(v, np.ndarray) for v in weights.values()):
        raise fail("policy.weights must map names to arrays")
    pid = _get(obj, "policy_id", str, fail)
    return PolicyFile(
        path=source,
        policy_id=pid,
        observation_space=_space(obj.get("observation_space"), "observation_space", fail),
        action_space=_space(obj.get("action_space"), "action_space", fail),
        kind=_get(policy, "kind", str, fail),
        config=_get(policy, "config", dict, fail),
        policy_observation_space=_space(policy.get("observation_space"), "policy space", fail),
        policy_action_space=_space(policy.get("action_space"), "policy action space", fail),
        weights=weights,
        agent_pipeline=check_pipeline_state(
            obj.get("agent_pipeline"), f"{source!r} agent pipeline"
        ),
        action_pipeline=check_pipeline_state(
            obj.get("action_pipeline"), f"{source!r} action pipeline"
        ),
        rlconnect_version=str(obj.get("rlconnect_version", "")),
        size=len(data),
        sha256=content_digest(data),
    )


def _show_arrays(value: Any) -> Any:
    """A nest with arrays shown as ``dtype[shape]`` and their first values."""
    import tree

    def show(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            flat = leaf.reshape(-1)
            return {
                "array": f"{leaf.dtype}{list(leaf.shape)}",
                "values": flat[:8].tolist() + (["..."] if flat.size > 8 else []),
            }
        return leaf

    return tree.map_structure(show, value)


def _frozen(params: dict[str, Any]) -> dict[str, Any]:
    """A member's params as a loaded policy uses them: statistics a training setting would
    update (``update``) are frozen in a deployed policy, and shown so."""
    if "update" not in params:
        return params
    return {k: ("frozen" if k == "update" else v) for k, v in params.items()}


def describe_policy_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A verified policy file as JSON values for people: spaces, pipelines (statistics
    shown by their first values), policy kind, config and weight sizes, file size and
    digest. Nothing is rebuilt, so unregistered kinds and connectors can be inspected too."""
    f = read_policy_file(path)
    values = sum(int(w.size) for w in f.weights.values())
    nbytes = sum(int(w.nbytes) for w in f.weights.values())

    def members(state: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"name": m["name"], "connector": m["connector"], **_frozen(_show_arrays(m["params"]))}
            for m in state["members"]
        ]

    return {
        "file": f.path,
        "format": f"{POLICY_FILE.name} v{POLICY_FILE.version}",
        "size_bytes": f.size,
        "sha256": f.sha256,
        "rlconnect_version": f.rlconnect_version,
        "policy_id": f.policy_id,
        "observation_space": describe_space(f.observation_space),
        "action_space": describe_space(f.action_space),
        "agent_pipeline": members(f.agent_pipeline),
        "policy": {
            "kind": f.kind,
            "config": f.config,
            "observation_space": describe_space(f.policy_observation_space),
            "action_space": describe_space(f.policy_action_space),
            "weights": {"values": values, "bytes": nbytes, "arrays": len(f.weights)},
        },
        "action_pipeline": members(f.action_pipeline),
    }
