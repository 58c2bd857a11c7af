"""Gathering batches from the remote runners of a RunnerGroup: one round, or a stream.

A round (``RunnerGroup.sample``) asks every healthy runner for one batch and concatenates
the answers in runner order; a stream (``RunnerGroup.sample_async``) keeps every runner
busy and yields batches as they finish. Both hand each batch's connector deltas to the
group's :class:`DeltaInbox`, and leave failures to the pool (restart, drop or raise).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from rlconnect.batches import MultiAgentBatch, SampleBatch, concat_samples
from rlconnect.batches.time_major import NOT_FOLDABLE
from rlconnect.collectors import CountStepsBy
from rlconnect.distributed.faults import RunnerFailedError, RunnerFailure
from rlconnect.distributed.pool import RunnerPool
from rlconnect.distributed.sync import ConnectorDeltas

__all__ = ["Batch", "DeltaInbox", "sample_round", "sample_stream", "tag_batch"]

Batch = SampleBatch | MultiAgentBatch


class DeltaInbox:
    """Connector deltas received with batches, by runner index, until the next sync."""

    def __init__(self, num_runners: int) -> None:
        self._by_runner: dict[int, list[ConnectorDeltas]] = {
            k: [] for k in range(1, num_runners + 1)
        }

    def add(self, k: int, deltas: ConnectorDeltas) -> None:
        """Deltas of one batch of runner ``k``."""
        self._by_runner[k].append(deltas)

    def take(self) -> list[ConnectorDeltas]:
        """Every delta received, in runner order then arrival order; empties the inbox."""
        out = [d for k in sorted(self._by_runner) for d in self._by_runner[k]]
        self.clear()
        return out

    def clear(self) -> None:
        """Forget every delta (after a restore they describe stale statistics)."""
        for k in self._by_runner:
            self._by_runner[k] = []


def batch_rows(batch: Batch, count_by: CountStepsBy) -> int:
    """Steps in ``batch`` as ``count_steps_by`` counts them."""
    if isinstance(batch, MultiAgentBatch):
        by_agent = count_by is CountStepsBy.AGENT_STEPS
        return batch.agent_steps() if by_agent else batch.env_steps()
    return len(batch)


def tag_batch(batch: Batch, **meta: Any) -> None:
    """Add ``meta`` to the batch's (or each policy batch's) ``meta`` dict."""
    parts = batch.policy_batches.values() if isinstance(batch, MultiAgentBatch) else [batch]
    for b in parts:
        b.meta.update(meta)


def sample_round(
    pool: RunnerPool, inbox: DeltaInbox, count_by: CountStepsBy, num_runners: int
) -> tuple[Batch, dict[str, Any]]:
    """One batch from every healthy runner, concatenated in runner order, and the info
    it is tagged with (``runner_rows``, ``runner_failures``, ``missing_rows``)."""
    inflight = {pool.submit_sample(k): k for k in pool.indices}
    results: dict[int, Batch] = {}
    failures: list[RunnerFailure] = []
    while inflight:
        k, value = pool.next_result(inflight, "sample", failures, resubmit=True)
        if value is not None:
            batch, deltas = value
            results[k] = batch
            inbox.add(k, deltas)
    if not results:
        raise RunnerFailedError("no remote runner produced a batch in sample()")
    order = sorted(results)
    out = concat_samples([results[k] for k in order])
    info = {
        "runner_rows": {k: batch_rows(results[k], count_by) for k in order},
        "runner_failures": [f.to_dict() for f in failures],
        "missing_rows": pool.promised_rows * (num_runners - len(order)),
    }
    tag_batch(out, **info)
    if len(order) > 1:  # runner k's sub-env i and runner j's are both env_id i
        refusal = (
            f"it joins the rows of {len(order)} runners, whose sub-envs share env ids; fold "
            "each runner's batch (sample_async() yields them one at a time), then join"
        )
        tag_batch(out, **{NOT_FOLDABLE: refusal})
    return out, info


def sample_stream(
    pool: RunnerPool,
    inbox: DeltaInbox,
    num_batches: int | None,
    require_runners: Callable[[], None],
) -> Generator[Batch, None, None]:
    """Runners' batches as they finish, each tagged ``runner_index`` and
    ``runner_failures``; ``num_batches=None`` runs until the iterator is closed.
    ``require_runners()`` raises when no healthy runner is left."""
    inflight: dict[Any, int] = {}
    submitted = 0

    def wanted() -> bool:
        return num_batches is None or submitted < num_batches

    def submit(k: int) -> None:
        nonlocal submitted
        inflight[pool.submit_sample(k)] = k
        submitted += 1

    def submit_idle() -> None:
        busy = set(inflight.values())
        for k in pool.indices:
            if k not in busy and wanted():
                submit(k)

    submit_idle()
    failures: list[RunnerFailure] = []
    try:
        while inflight:
            k, value = pool.next_result(inflight, "sample_async", failures, resubmit=True)
            if value is None:
                if k not in pool.actors:  # skipped: a healthy runner takes its turn
                    submitted -= 1
                    submit_idle()
                continue
            batch, deltas = value
            inbox.add(k, deltas)
            if k in pool.actors and wanted():
                submit(k)
            tag_batch(batch, runner_index=k, runner_failures=[f.to_dict() for f in failures])
            failures = []
            yield batch
        if wanted():
            require_runners()  # every runner was skipped: say so
    finally:
        if inflight:  # closed early: let the runners finish, drop those batches
            pool.abandon(list(inflight), timeout_s=60)
