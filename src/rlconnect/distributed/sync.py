"""Exact filter sync: connector statistics merged at the driver, never double counted.

A connector takes part when it keeps a *delta*, the statistics of the data it saw since it
was last told the merged state (``get_delta()`` / ``reset_delta()``, as ``MeanStdFilter``
does), and its statistics merge with
:func:`rlconnect.connectors.agent.mean_std_filter.merge_statistics` (count, mean, m2).
The protocol, for remote runners ``1..K`` and the driver's reference statistics ``T``::

    batch_k, delta_k = runner_k.sample(); runner_k.reset_delta()   # atomically, in the actor
    T = merge([T, delta_1, ..., delta_K])                        # at sync, in runner order
    runner_k.set_statistics(T)                                   # every runner, one put

Deltas travel with the batches they describe, so the statistics hold exactly the data of
the batches the caller received, each once, however often ``sync`` runs.

Filters built with ``freeze_between_syncs=True`` (``RunnerConfig(observation_filter_sync=
"frozen")``) normalise with ``T`` as of the last sync: a remote runner hands its data over
with every batch (``reset_delta``), so it never folds its own data in between syncs, and
what it outputs depends on the raw data and the sync points only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlconnect.connectors.agent.mean_std_filter import MeanStdFilter, merge_statistics

__all__ = ["ConnectorDeltas", "apply_deltas", "check_frozen_filters", "pop_connector_deltas"]

#: ``{policy_id: {"agent" | "action": {member_name: delta_statistics}}}``
ConnectorDeltas = dict[str, dict[str, dict[str, Any]]]


def _pipelines(runner: Any, pid: str) -> dict[str, Any]:
    return {"agent": runner.agent_pipeline(pid), "action": runner.action_pipeline(pid)}


def _delta_members(pipe: Any) -> list[tuple[str, Any]]:
    return [
        (name, pipe[name])
        for name in pipe.names
        if callable(getattr(pipe[name], "get_delta", None))
        and callable(getattr(pipe[name], "reset_delta", None))
    ]


def pop_connector_deltas(runner: Any) -> ConnectorDeltas:
    """The deltas of every syncable connector of ``runner``, which are then reset."""
    out: ConnectorDeltas = {}
    for pid in runner.policies:
        for role, pipe in _pipelines(runner, pid).items():
            for name, conn in _delta_members(pipe):
                out.setdefault(pid, {}).setdefault(role, {})[name] = conn.get_delta()
                conn.reset_delta()
    return out


def apply_deltas(reference: Any, deltas: Iterable[Mapping[str, Any]]) -> ConnectorDeltas:
    """Merge ``deltas`` (in the given order) into the statistics of the ``reference``
    runner's syncable connectors, and return the merged statistics of those connectors
    (the broadcast payload for ``set_connector_states``)."""
    deltas = list(deltas)
    merged: ConnectorDeltas = {}
    for pid in reference.policies:
        for role, pipe in _pipelines(reference, pid).items():
            for name, conn in _delta_members(pipe):
                parts = [d[pid][role][name] for d in deltas if name in d.get(pid, {}).get(role, {})]
                total = merge_statistics([conn.get_statistics(), *parts])
                conn.set_statistics(total)  # also clears the reference's own delta
                merged.setdefault(pid, {}).setdefault(role, {})[name] = total
    return merged


def check_frozen_filters(runner: Any) -> None:
    """Raise ValueError if ``runner`` has filters frozen between syncs and samples in a
    background thread: that thread starts the next batch (a sync point of a runner on its
    own) before the group takes the delta, so the runner would fold in its own data."""
    if not runner.config.sample_async:
        return
    for pid in runner.policies:
        for pipe in _pipelines(runner, pid).values():
            if any(isinstance(c, MeanStdFilter) and c.freeze_between_syncs for c in pipe):
                raise ValueError(
                    "RunnerGroup: filters frozen between syncs (observation_filter_sync="
                    "'frozen') need RunnerConfig(sample_async=False) on remote runners; "
                    "use RunnerGroup.sample_async() for overlap instead"
                )
