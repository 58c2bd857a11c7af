"""rlconnect.deploy: a trained policy, with what it saw in training, outside the runner.

- ``export_policy(source, path)`` writes one pickle-free file holding one policy (kind,
  config, weights), its agent pipeline with frozen statistics and its action pipeline;
  ``load_policy(path)`` gives a :class:`DeployedPolicy` that acts on raw observations,
  one session per episode, with the same actions as ``runner.compute_single_action``.
- ``export_onnx(source, path)`` writes one ONNX model from the raw observation to the env
  action, connectors included (stateful ones as explicit state inputs and outputs).

Built on ``rlconnect.checkpoints``, ``rlconnect.connectors`` and ``rlconnect.policy``; the
runner never imports this package. torch and onnx are imported only by what needs them.
"""

from __future__ import annotations

import os
from typing import Any

from rlconnect.batches import DEFAULT_POLICY_ID
from rlconnect.deploy.deployed import DeployedPolicy, load_policy
from rlconnect.deploy.policy_file import read_policy_file, write_policy_file
from rlconnect.deploy.sources import resolve

__all__ = [
    "DeployedPolicy",
    "export_onnx",
    "export_policy",
    "load_policy",
    "read_policy_file",
]


def export_policy(
    source: Any, path: str | os.PathLike[str], *, policy_id: str = DEFAULT_POLICY_ID
) -> int:
    """Write the policy ``policy_id`` of ``source`` and its pipelines to exactly ``path``.

    ``source`` is an ``EnvRunner``, a ``RunnerGroup``, or the path of a runner checkpoint
    or of a ``rlconnect sample --out`` run folder. Returns the file's size in bytes. Raises
    KeyError naming the policy ids there are for an unknown ``policy_id``, ``ExportError``
    for a policy whose kind cannot be rebuilt by name (see ``rc.register_policy``); a
    failed export writes nothing.
    """
    return write_policy_file(resolve(source, policy_id), path)


def export_onnx(
    source: Any,
    path: str | os.PathLike[str],
    *,
    policy_id: str = DEFAULT_POLICY_ID,
    opset: int | None = None,
) -> dict[str, Any]:
    """Write one ONNX model computing the env action (the distribution's mode) from the
    raw observation; returns the interface written to its metadata (see
    ``rlconnect.deploy.onnx_export``). Needs the ``onnx`` extra."""
    from rlconnect.deploy.onnx_export import write_onnx

    return write_onnx(resolve(source, policy_id), path, opset=opset)
