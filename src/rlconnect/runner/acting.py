"""The one place the runner calls a policy: inputs -> policy -> connectors -> env actions.

Sampling (every poll, dense or not, single- or multi-agent) and inference
(``compute_actions``) both act through :func:`act`: ``policy.compute_actions`` (errors
become a ``PolicyError`` naming the policy and rows), logged actions of an external env
replacing the policy's, ``on_policy_output`` of the agent pipeline, the action pipeline,
and the check that every env action lies in its space.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from rlconnect.batches.take import take_rows
from rlconnect.connectors.policy_step import respond
from rlconnect.envs.external import apply_logged_actions
from rlconnect.errors import PolicyError, describe_exception
from rlconnect.policy import Policy
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.pipelines import PolicyPipelines

__all__ = ["RowSubset", "act", "live_rows"]


class RowSubset(Mapping[str, Any]):
    """Policy inputs for some rows of a poll (e.g. those whose episode goes on): each
    column is taken when first read, so a policy that reads only ``obs`` pays for one
    column, not for every column the agent pipeline made (and ``num_rows`` for none).
    ``infos`` are not inputs."""

    __slots__ = ("_columns", "_rows", "_taken", "num_rows")

    def __init__(self, columns: Mapping[str, Any], rows: np.ndarray) -> None:
        self._columns, self._rows = columns, rows
        self._taken: dict[str, Any] = {}
        self.num_rows = len(rows)

    def __getitem__(self, key: str) -> Any:
        if key in self._taken:
            return self._taken[key]
        if key == "infos":
            raise KeyError(key)
        value = self._taken[key] = take_rows(self._columns[key], self._rows)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._columns if k != "infos")

    def __len__(self) -> int:
        return len(self._columns) - ("infos" in self._columns)


def live_rows(
    columns: Mapping[str, Any],
    env_ids: np.ndarray,
    agent_ids: tuple,
    where: np.ndarray,
    *,
    multi: bool,
) -> tuple[RowSubset, np.ndarray, tuple]:
    """The policy inputs, env ids and agent ids of the rows of a poll where ``where`` is
    true (e.g. those whose episode goes on); ``multi=False``: every row is the same agent."""
    ai = where.nonzero()[0]
    kept = tuple(agent_ids[i] for i in ai.tolist()) if multi else agent_ids[: len(ai)]
    return RowSubset(columns, ai), env_ids[ai], kept


def act(
    pid: str,
    policy: Policy,
    pipes: PolicyPipelines,
    inputs: Any,
    env_ids: Any,
    agent_ids: tuple,
    *,
    explore: bool,
    check: Callable[[Any, np.ndarray, tuple], None] | None = None,
    logged: Any = None,
    timers: PerfTimers | None = None,
) -> tuple[dict[str, Any], Any]:
    """The policy's outputs (what gets recorded) and the env actions for the rows
    ``inputs`` (agent-pipeline output).

    ``check(env_actions, env_ids, agent_ids)`` rejects actions outside the env's spaces
    (skipped for logged actions, which the env itself chose); ``timers`` get the
    inference and action-processing time.
    """
    clock = time.perf_counter
    weight = 0.0 if timers is None else timers.weight  # (0.0: an untimed poll, see PerfTimers)
    t0 = clock() if weight else 0.0
    try:
        actions, state_outs, fetches = policy.compute_actions(inputs, explore=explore)
    except Exception as exc:
        raise PolicyError(
            f"policy {pid!r} ({type(policy).__name__}) raised {describe_exception(exc)} in "
            f"compute_actions on {len(env_ids)} row(s) (env ids "
            f"{sorted(set(env_ids.tolist()))[:5]}, agents {sorted(set(map(str, agent_ids)))[:5]})"
        ) from exc
    if logged:  # ExternalEnv.log_action: the logged action is what gets recorded
        actions, fetches = apply_logged_actions(
            policy, logged, env_ids, agent_ids, actions, fetches
        )
    t1 = clock() if weight else 0.0
    outputs, env_actions = respond(
        pipes.agent[pid], pipes.action[pid], env_ids, agent_ids, actions, state_outs, fetches
    )
    if check is not None and not logged:  # never step an env with an action outside its space
        check(env_actions, env_ids, agent_ids)
    if weight and timers is not None:
        secs = timers.seconds
        secs["mean_inference_ms"] += (t1 - t0) * weight
        secs["mean_action_processing_ms"] += (clock() - t1) * weight
    return outputs, env_actions
