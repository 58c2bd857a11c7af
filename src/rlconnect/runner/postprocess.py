"""Per-trajectory postprocessing (with other agents visible) and connector-state digests."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import SampleBatch, concat_samples
from rlconnect.policy import Policy

if TYPE_CHECKING:
    from rlconnect.connectors import ConnectorPipeline
    from rlconnect.runner.runner import EnvRunner

__all__ = ["postprocess_batches", "state_digest"]


def state_digest(pipe: ConnectorPipeline) -> str:
    """A short SHA-256 of a pipeline's structure and statistics: which state shaped a batch."""
    h = hashlib.sha256()
    h.update(json.dumps(pipe.names).encode())
    for name, stats in sorted(pipe.get_statistics().items()):
        h.update(name.encode())
        for path, leaf in tree.flatten_with_path(stats):
            h.update(repr(path).encode())
            h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]


def _needs_postprocessing(runner: EnvRunner) -> bool:
    if runner.callbacks.overrides("on_postprocess_trajectory"):
        return True
    return any(
        type(p).postprocess_trajectory is not Policy.postprocess_trajectory
        for p in runner.policies.values()
    )


def _split(batch: SampleBatch, traj: np.ndarray) -> list[tuple[int, SampleBatch]]:
    """Trajectories are contiguous in ``batch``: cut at every change of ``traj``."""
    if not len(traj):
        return []
    starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]])
    stops = np.r_[starts[1:], len(traj)]
    return [(int(traj[a]), batch[a:b]) for a, b in zip(starts.tolist(), stops.tolist())]


def postprocess_batches(
    runner: EnvRunner, built: dict[str, tuple[SampleBatch, np.ndarray]]
) -> dict[str, SampleBatch]:
    """Run ``policy.postprocess_trajectory`` per agent trajectory, then the callback.

    Other agents' trajectories of the same episode in this batch are passed as
    ``other_agent_batches = {agent_id: (policy_id, policy, batch)}``.
    """
    if not _needs_postprocessing(runner):
        return {pid: b for pid, (b, _) in built.items()}
    info = runner._stepper.traj_info
    pieces: list[tuple[str, int, SampleBatch]] = []
    for pid, (batch, traj) in built.items():
        pieces.extend((pid, t, b) for t, b in _split(batch, traj))
    by_episode: dict[int, list[tuple[str, int, SampleBatch]]] = {}
    for pid, t, b in pieces:
        by_episode.setdefault(int(b["eps_id"][0]), []).append((pid, t, b))
    out: dict[str, list[SampleBatch]] = {pid: [] for pid in built}
    for pid, t, b in pieces:
        agent_id, episode = info.get(t, (None, None))
        others: dict[Any, tuple[str, Policy, SampleBatch]] = {}
        for opid, ot, ob in by_episode[int(b["eps_id"][0])]:
            if ot != t:
                oagent = info.get(ot, (ot, None))[0]
                others[oagent] = (opid, runner.policies[opid], ob)
        policy = runner.policies[pid]
        original = b
        b = policy.postprocess_trajectory(b.copy(), others, episode)
        if runner.callbacks.overrides("on_postprocess_trajectory"):
            runner.callbacks.on_postprocess_trajectory(
                runner=runner,
                episode=episode,
                agent_id=agent_id,
                policy_id=pid,
                policies=runner.policies,
                postprocessed_batch=b,
                original_batches=dict(others) | {agent_id: (pid, policy, original)},
            )
        out[pid].append(b)
    return {pid: concat_samples(bs) for pid, bs in out.items() if bs}
