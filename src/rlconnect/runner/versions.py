"""Policy versions: the learner's number for a policy's weights, and how far behind a
batch's rows are.

Every ``set_weights`` makes a new version (``policy.weights_seq``); every recorded row
carries the version that chose its action (column ``weights_seq``). A batch handed out
gets ``meta["weights_lag"]``: how many versions its rows are behind the policy's version
at that moment (rows of ``sample_async`` and of remote runners can be).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from rlconnect.policy import Policy

__all__ = ["mark_weights_lag", "weights_versions"]


def _version(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{where} must be an int >= 0 (a weights version), got {value!r}")
    return int(value)


def weights_versions(
    weights: Mapping[str, Any], weights_seq: int | Mapping[str, int] | None
) -> dict[str, int]:
    """The version to give each policy of ``weights`` (none when ``weights_seq`` is None):
    one int for all, or an int by policy id (ids that get no weights are a ValueError)."""
    if weights_seq is None:
        return {}
    if isinstance(weights_seq, Mapping):
        extra = sorted(set(weights_seq) - set(weights))
        if extra:
            raise ValueError(f"weights_seq names policies {extra} that get no weights")
        return {pid: _version(v, f"weights_seq[{pid!r}]") for pid, v in weights_seq.items()}
    seq = _version(weights_seq, "weights_seq")
    return dict.fromkeys(weights, seq)


def mark_weights_lag(batch: SampleBatch | MultiAgentBatch, policies: Mapping[str, Policy]) -> None:
    """Set ``meta["weights_lag"] = {"max": int, "mean": float}`` on each policy batch
    with a ``weights_seq`` column and rows: its policy's version now minus its rows'
    versions (0: every row was acted by the current weights)."""
    if isinstance(batch, MultiAgentBatch):
        parts = list(batch.policy_batches.items())
    else:
        parts = [(batch.meta.get("policy_id", DEFAULT_POLICY_ID), batch)]
    for pid, b in parts:
        policy = policies.get(pid)
        if policy is None or not len(b) or "weights_seq" not in b:
            continue
        # once per batch handed out: two ufunc reductions, no temporary array
        seqs = np.asarray(b["weights_seq"])
        now, n = policy.weights_seq, len(seqs)
        lag_max = now - int(np.minimum.reduce(seqs))
        lag_sum = now * n - int(np.add.reduce(seqs))  # exact: the lags' sum
        b.meta["weights_lag"] = {"max": lag_max, "mean": lag_sum / n}
