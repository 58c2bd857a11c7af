"""Per-trajectory postprocessing (with other agents visible) and connector-state digests."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import SampleBatch, concat_samples
from rlconnect.episodes import EpisodeHooks
from rlconnect.policy import Policy
from rlconnect.runner.callbacks import Callbacks

if TYPE_CHECKING:
    from rlconnect.connectors import ConnectorPipeline

__all__ = ["postprocess_batches", "state_digest"]


def state_digest(pipe: ConnectorPipeline) -> str:
    """A short SHA-256 of a pipeline's structure and statistics: which state shaped a batch.

    Taken once per batch: the structure's part is hashed once per structure
    (``_structure_hash``) and copied, so a pipeline without statistics (most) costs a copy."""
    h = _structure_hash(tuple(pipe.names)).copy()
    for name, stats in sorted(pipe.get_statistics().items()):
        h.update(name.encode())
        for path, leaf in tree.flatten_with_path(stats):
            h.update(repr(path).encode())
            h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _structure_hash(names: tuple[str, ...]) -> Any:
    """The SHA-256 of a pipeline's member names (never updated: callers copy it)."""
    return hashlib.sha256(json.dumps(names).encode())


def _needs_postprocessing(policies: Mapping[str, Policy], callbacks: Callbacks) -> bool:
    if callbacks.overrides("on_postprocess_trajectory"):
        return True
    return any(
        type(p).postprocess_trajectory is not Policy.postprocess_trajectory
        for p in policies.values()
    )


def _split(batch: SampleBatch, traj: np.ndarray) -> list[tuple[int, SampleBatch]]:
    """Trajectories are contiguous in ``batch``: cut at every change of ``traj``."""
    if not len(traj):
        return []
    starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]])
    stops = np.r_[starts[1:], len(traj)]
    return [(int(traj[a]), batch[a:b]) for a, b in zip(starts.tolist(), stops.tolist())]


def postprocess_batches(
    built: dict[str, tuple[SampleBatch, np.ndarray]],
    hooks: EpisodeHooks,
    owner: Callable[[int], tuple[Any, Any]],
) -> dict[str, SampleBatch]:
    """Run ``policy.postprocess_trajectory`` per agent trajectory, then the callback.

    Other agents' trajectories of the same episode in this batch are passed as
    ``other_agent_batches = {agent_id: (policy_id, policy, batch)}``; ``owner(traj_id)``
    gives a trajectory's ``(agent_id, episode)``.
    """
    policies, callbacks = hooks.policies, hooks.callbacks
    if not _needs_postprocessing(policies, callbacks):
        return {pid: b for pid, (b, _) in built.items()}
    pieces: list[tuple[str, int, SampleBatch]] = []
    for pid, (batch, traj) in built.items():
        pieces.extend((pid, t, b) for t, b in _split(batch, traj))
    by_episode: dict[int, list[tuple[str, int, SampleBatch]]] = {}
    for pid, t, b in pieces:
        by_episode.setdefault(int(b["eps_id"][0]), []).append((pid, t, b))
    out: dict[str, list[SampleBatch]] = {pid: [] for pid in built}
    for pid, t, b in pieces:
        agent_id, episode = owner(t)
        others: dict[Any, tuple[str, Policy, SampleBatch]] = {}
        for opid, ot, ob in by_episode[int(b["eps_id"][0])]:
            if ot != t:
                oagent = owner(ot)[0]
                others[ot if oagent is None else oagent] = (opid, policies[opid], ob)
        policy = policies[pid]
        original = b
        b = policy.postprocess_trajectory(b.copy(), others, episode)
        if callbacks.overrides("on_postprocess_trajectory"):
            callbacks.on_postprocess_trajectory(
                runner=hooks.runner,
                episode=episode,
                agent_id=agent_id,
                policy_id=pid,
                policies=policies,
                postprocessed_batch=b,
                original_batches=dict(others) | {agent_id: (pid, policy, original)},
            )
        out[pid].append(b)
    return {pid: concat_samples(bs) for pid, bs in out.items() if bs}
