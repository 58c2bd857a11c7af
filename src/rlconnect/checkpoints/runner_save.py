"""Writing runner checkpoints: the folder of ``rlconnect.checkpoints.runner_format``, from
plain data the runner hands over (its config as JSON, one ``PolicySnapshot`` per policy).

Everything is encoded before a byte is written (spaces, policy configs as JSON), and the
folder is put in place atomically: a failed save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from rlconnect._version import __version__
from rlconnect.checkpoints.container import save_nest
from rlconnect.checkpoints.formats import RUNNER_CHECKPOINT, WEIGHTS_FILE
from rlconnect.checkpoints.pipelines import save_pipeline
from rlconnect.checkpoints.runner_format import (
    FILE_NAMES,
    FILE_ROLES,
    MANIFEST,
    policy_folder,
    sha256_hex,
    write_folder_atomically,
)
from rlconnect.connectors.pipeline import ConnectorPipeline
from rlconnect.spaces import space_to_json

__all__ = ["PolicySnapshot", "save_runner_checkpoint"]


@attrs.frozen
class PolicySnapshot:
    """One policy as a checkpoint saves it: its kind (None: a class that cannot be rebuilt
    by name), constructor config, spaces, weights and their version, and the spaces the
    env uses together with its three pipelines."""

    policy_id: str
    kind: str | None
    kwargs: dict[str, Any]
    observation_space: gym.Space
    action_space: gym.Space
    env_observation_space: gym.Space
    env_action_space: gym.Space
    weights: Mapping[str, np.ndarray]
    weights_seq: int
    agent_pipeline: ConnectorPipeline
    action_pipeline: ConnectorPipeline
    learner_pipeline: ConnectorPipeline

    def entry(self) -> dict[str, Any]:
        """The manifest entry without its files; ValueError naming the policy for a config
        or space that is not JSON."""
        try:
            json.dumps(self.kwargs, allow_nan=False)
            spec = {
                "kind": self.kind,
                "kwargs": self.kwargs,
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space),
            }
            return {
                "id": self.policy_id,
                "spec": spec,
                "env_observation_space": space_to_json(self.env_observation_space),
                "env_action_space": space_to_json(self.env_action_space),
                "weights_seq": self.weights_seq,
            }
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cannot save policy {self.policy_id!r}: {exc}") from exc

    def write(self, role: str, full: str) -> None:
        """Write the file of ``role`` (one of ``FILE_ROLES``) to ``full``."""
        if role == "weights":
            where = f"policy {self.policy_id!r} weights"
            save_nest(full, {"weights": dict(self.weights)}, WEIGHTS_FILE, where=where)
        else:
            save_pipeline(getattr(self, role), full)


def save_runner_checkpoint(
    path: str | os.PathLike[str],
    config: Mapping[str, Any],
    config_omitted: Sequence[str],
    policies: Sequence[PolicySnapshot],
) -> None:
    """Write a runner checkpoint atomically to the folder ``path``: ``config`` (JSON
    values; ``config_omitted`` names the fields left out) and ``policies``."""
    entries = [p.entry() for p in policies]

    def fill(tmp: str) -> None:
        for i, (entry, snap) in enumerate(zip(entries, policies, strict=True)):
            folder = policy_folder(snap.policy_id, i)
            os.makedirs(os.path.join(tmp, "policies", folder))
            files = {}
            for role in FILE_ROLES:
                rel = f"policies/{folder}/{FILE_NAMES[role]}"
                full = os.path.join(tmp, *rel.split("/"))
                snap.write(role, full)
                with open(full, "rb") as f:
                    data = f.read()
                files[role] = {"path": rel, "sha256": sha256_hex(data), "size": len(data)}
            entry["files"] = files
        manifest = {
            **RUNNER_CHECKPOINT.header(),
            "rlconnect_version": __version__,
            "config": dict(config),
            "config_omitted": list(config_omitted),
            "policies": entries,
        }
        text = json.dumps(manifest, indent=2, allow_nan=False)
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            f.write(text + "\n")

    write_folder_atomically(path, fill)
