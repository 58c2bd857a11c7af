"""Reading runner checkpoints: everything verified before anything is built.

``load_checkpoint(path)`` checks the manifest (schema, paths, sizes), reads every file and
checks its SHA-256, parses the weights from the verified bytes and decodes the spaces. The
pipelines are only verified here; they are built later for a connector context
(``rlconnect.checkpoints.load_pipeline``), through the connector registry: see
``rlconnect.checkpoints.runner_restore``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from rlconnect.checkpoints.container import unpack
from rlconnect.checkpoints.formats import WEIGHTS_FILE
from rlconnect.checkpoints.runner_format import FILE_ROLES, MANIFEST, read_blob, read_manifest
from rlconnect.errors import CheckpointError
from rlconnect.spaces import MAX_JSON_DEPTH, space_from_json

__all__ = ["LoadedCheckpoint", "PolicyRecord", "load_checkpoint"]


@attrs.define
class PolicyRecord:
    """One policy of a verified checkpoint."""

    policy_id: str
    kind: str | None
    kwargs: dict[str, Any]
    observation_space: gym.Space
    action_space: gym.Space
    env_observation_space: gym.Space
    env_action_space: gym.Space
    weights: dict[str, np.ndarray]
    agent_pipeline_file: str
    action_pipeline_file: str
    learner_pipeline_file: str | None = None  #: None: saved before learner pipelines
    weights_seq: int = 0  #: the version of ``weights`` (0 in checkpoints that predate it)


@attrs.define
class LoadedCheckpoint:
    """A checkpoint whose every file was verified; pipelines are built on demand (by ctx)."""

    path: str
    manifest: dict[str, Any]
    policies: dict[str, PolicyRecord]

    def saved_config(
        self, fields: Collection[str], overridden: Collection[str] = ()
    ) -> dict[str, Any]:
        """The saved config's fields by name, for the runner to rebuild its config from;
        ``CheckpointError`` for a field not among ``fields`` (the config class's).

        The saved ``env_config`` is kept, as the env creator's own input (for a gymnasium
        id, the ``gym.make`` keyword arguments), once checked to be plain JSON data (string
        keys, finite numbers, at most ``MAX_JSON_DEPTH`` levels), unless it is among
        ``overridden`` (the caller replaces it, e.g. when the checkpoint comes from someone
        else). Which saved values the runner keeps (never its file paths) is the runner's
        choice.
        """
        saved = dict(self.manifest["config"])
        if "env_config" in saved and "env_config" not in overridden:
            _check_plain(saved["env_config"], "env_config", 0, self.path)
        unknown = sorted(set(saved) - set(fields))
        if unknown:
            raise self.defect(f"config has unknown fields {unknown}")
        return saved

    def defect(self, msg: str) -> CheckpointError:
        """A ``CheckpointError`` naming this checkpoint's manifest and ``msg``."""
        return CheckpointError(f"checkpoint {self.path!r}: {MANIFEST}: {msg}")


def _check_plain(value: Any, where: str, depth: int, path: str) -> None:
    """CheckpointError unless ``value`` is plain JSON data: JSON already gives only dicts
    with string keys, lists, strings, numbers, booleans and None, but also NaN and
    infinities, and nesting as deep as the parser's recursion allows."""

    def fail(msg: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path!r}: manifest.json: config {where}: {msg}")

    if depth > MAX_JSON_DEPTH:
        raise fail(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(v, f"{where}[{k!r}]", depth + 1, path)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]", depth + 1, path)
    elif isinstance(value, float) and not math.isfinite(value):
        raise fail(f"{value} is not a finite number")


def load_checkpoint(path: str | os.PathLike[str]) -> LoadedCheckpoint:
    """Read and verify the checkpoint at ``path`` (see the module docstring)."""
    root = os.fspath(path)
    manifest = read_manifest(root)
    policies = {}
    for entry in manifest["policies"]:
        policies[entry["id"]] = _load_policy_record(root, entry)
    return LoadedCheckpoint(root, manifest, policies)


def _load_policy_record(root: str, entry: dict[str, Any]) -> PolicyRecord:
    pid, spec, files = entry["id"], entry["spec"], entry["files"]
    blobs = {role: read_blob(root, files[role]) for role in FILE_ROLES if role in files}
    spaces = {}
    for key, obj in (
        ("observation_space", spec["observation_space"]),
        ("action_space", spec["action_space"]),
        ("env_observation_space", entry["env_observation_space"]),
        ("env_action_space", entry["env_action_space"]),
    ):
        try:
            spaces[key] = space_from_json(obj)
        except Exception as exc:  # the codec validates hostile input; any failure is a defect
            raise CheckpointError(
                f"checkpoint {root!r}: manifest.json: policy {pid!r}: invalid {key}: {exc}"
            ) from None
    weights_path, data = blobs["weights"]
    return PolicyRecord(
        policy_id=pid,
        kind=spec["kind"],
        kwargs=dict(spec["kwargs"]),
        weights=_parse_weights(data, weights_path),
        agent_pipeline_file=blobs["agent_pipeline"][0],
        action_pipeline_file=blobs["action_pipeline"][0],
        learner_pipeline_file=blobs["learner_pipeline"][0] if "learner_pipeline" in blobs else None,
        weights_seq=entry.get("weights_seq", 0),
        **spaces,
    )


def _parse_weights(data: bytes, source: str) -> dict[str, np.ndarray]:
    _, nest = unpack(data, WEIGHTS_FILE, source=source)
    weights = nest.get("weights") if isinstance(nest, dict) else None
    if not isinstance(weights, dict) or not all(
        isinstance(v, np.ndarray) for v in weights.values()
    ):
        raise CheckpointError(
            f"cannot load weights file {source!r}: expected an object 'weights' of arrays"
        )
    return weights
