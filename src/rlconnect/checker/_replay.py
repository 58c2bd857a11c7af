"""The inputs of the pipeline checks, and feeding them through a pipeline member by member.

``_prepare`` turns ``check_pipeline``'s arguments into a ``_Setup`` (rows, identities,
rewards, actions); ``_step`` feeds chosen rows through every member, recording a snapshot
of each member's output columns (a ``Trace``), then calls ``on_policy_output`` with seeded
actions and RNN state, as a runner would.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import tree

from rlconnect.checker._errors import _fail
from rlconnect.connectors.action.convert_to_numpy import to_numpy
from rlconnect.connectors.base import (
    ActionConnector,
    ActionData,
    AgentConnector,
    AgentData,
)
from rlconnect.connectors.learner import LearnerConnector, LearnerConnectorPipeline
from rlconnect.connectors.pipeline import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
)
from rlconnect.spaces import check_batch, stack_samples

_DEFAULT_ROWS = 8
Trace = list[tuple[str, dict[str, Any]]]  # per member, in order: (name, snapshot of columns)


# -- inputs -------------------------------------------------------------------------------------


@attrs.define
class _Setup:
    pipe: ConnectorPipeline
    is_agent: bool
    inputs: Any  # B rows of the pipeline's input space (or policy outputs for action pipelines)
    n: int
    env_ids: np.ndarray
    agent_ids: tuple[Any, ...]
    rewards: np.ndarray
    actions: Any  # rows of ctx.action_space fed to on_policy_output
    n_actions: int
    steps: int

    @property
    def column(self) -> str:
        return "obs" if self.is_agent else "actions"


def _as_pipeline(obj: Any) -> ConnectorPipeline:
    if isinstance(obj, LearnerConnector | LearnerConnectorPipeline):
        raise TypeError(
            "check_pipeline replays agent and action pipelines step by step; a learner "
            f"{'pipeline' if isinstance(obj, ConnectorPipeline) else 'connector'} works on "
            "whole batches: call it on a batch, and check_policy(policy) for what it needs"
        )
    if isinstance(obj, ConnectorPipeline):
        return obj
    if isinstance(obj, AgentConnector):
        return AgentConnectorPipeline(obj.ctx, [copy.deepcopy(obj)])
    if isinstance(obj, ActionConnector):
        return ActionConnectorPipeline(obj.ctx, [copy.deepcopy(obj)])
    raise TypeError(f"check_pipeline needs a connector or a pipeline, got {type(obj).__name__}")


def _sample(space: gym.Space, n: int, seed: int) -> Any:
    space = copy.deepcopy(space)
    space.seed(seed)
    return stack_samples(space, [space.sample() for _ in range(n)])


def _nrows(batch: Any) -> int:
    leaves = tree.flatten(batch)
    if not leaves or not getattr(leaves[0], "shape", ()):
        raise _fail("inputs", "the batch has no array with a leading row axis")
    return int(leaves[0].shape[0])


def _prepare(
    obj: Any,
    observations: Any,
    env_ids: Sequence[int] | None,
    agent_ids: Sequence[Any] | None,
    rewards: Any,
    actions: Any,
    steps: int,
    seed: int = 0,
) -> _Setup:
    pipe = _as_pipeline(obj)
    is_agent = isinstance(pipe, AgentConnectorPipeline)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"check_pipeline: steps must be an int >= 1, got {steps!r}")
    if observations is None:
        use_actions = not is_agent and actions is not None
        observations = actions if use_actions else _sample(pipe.input_space, _DEFAULT_ROWS, seed)
    n = _nrows(observations)
    if is_agent:
        try:
            check_batch(pipe.input_space, observations, field="observations")
        except ValueError as exc:
            msg = f"the observations do not fit the context's space: {exc}"
            raise _fail("inputs", msg) from None
    env_arr = np.arange(n) if env_ids is None else np.asarray(env_ids, np.int64).reshape(-1)
    agents = ("agent0",) * n if agent_ids is None else tuple(agent_ids)
    keys = list(zip(env_arr.tolist(), agents))
    if len(env_arr) != n or len(agents) != n or len(set(keys)) != n:
        raise _fail("inputs", f"need {n} distinct (env_id, agent_id) rows, got {keys}")
    rng = np.random.default_rng(seed)
    reward_arr = (
        (rng.normal(size=n) * 3).astype(np.float32) if rewards is None else np.asarray(rewards)
    )
    if is_agent and actions is None:
        actions = _sample(pipe.ctx.action_space, n, seed + 1)
    n_actions = _nrows(actions) if actions is not None else 0
    return _Setup(pipe, is_agent, observations, n, env_arr, agents, reward_arr, actions,
                  n_actions, steps)  # fmt: skip


# -- running one step, member by member ---------------------------------------------------------


def _copy_leaf(x: Any) -> np.ndarray:
    return np.array(to_numpy(x), copy=True)


def _snapshot(data: Any) -> dict[str, Any]:
    return {k: tree.map_structure(_copy_leaf, v) for k, v in data.columns.items()}


def _take(batch: Any, idx: np.ndarray) -> Any:
    return tree.map_structure(lambda x: x[idx], batch)


def _step(
    s: _Setup,
    pipe: ConnectorPipeline,
    check: str,
    rows: Sequence[tuple[int, Any, int, float]],
    t: int,
) -> Trace:
    """Feed ``rows`` of ``(env_id, agent_id, input row, tag)`` through ``pipe``; trace members."""
    env_ids = np.array([r[0] for r in rows], np.int64)
    agent_ids = tuple(r[1] for r in rows)
    idx = np.array([r[2] for r in rows], np.intp)
    tags = np.array([r[3] for r in rows], np.float64)
    if s.is_agent:
        m = len(rows)
        cols = {
            "obs": _take(s.inputs, idx),
            "rewards": s.rewards[idx % len(s.rewards)],
            "terminateds": np.zeros(m, bool),
            "truncateds": np.zeros(m, bool),
            "t": np.full(m, t, np.int64),
        }
        data: Any = AgentData(env_ids, agent_ids, cols)
    else:
        data = ActionData(env_ids, agent_ids, {"actions": _take(s.inputs, idx)})
    kind = type(data)
    trace: Trace = []
    for name, c in pipe.items():
        try:
            data = c(data)
        except Exception as exc:
            msg = f"raised {type(exc).__name__} at step {t}: {exc}"
            raise _fail(check, msg, pipe, name) from exc
        if not isinstance(data, kind):
            msg = f"returned {type(data).__name__} instead of {kind.__name__}"
            raise _fail(check, msg, pipe, name)
        trace.append((name, _snapshot(data)))
    if s.is_agent:
        _policy_output(s, pipe, check, data, env_ids, agent_ids, idx, tags)
    return trace


def _policy_output(
    s: _Setup,
    pipe: ConnectorPipeline,
    check: str,
    data: Any,
    env_ids: np.ndarray,
    agent_ids: tuple,
    idx: np.ndarray,
    tags: np.ndarray,
) -> None:
    cols: dict[str, Any] = {}
    if s.actions is not None:
        cols["actions"] = _take(s.actions, idx % s.n_actions)
    for i, init in enumerate(pipe.ctx.initial_states):
        init = np.asarray(init)
        base = data.get(f"state_in_{i}")
        if base is None:
            base = np.broadcast_to(init, (len(idx), *init.shape))
        bump = tags.reshape(-1, *([1] * init.ndim))
        cols[f"state_out_{i}"] = (np.asarray(to_numpy(base)) + bump).astype(init.dtype)
    out = ActionData(env_ids, agent_ids, cols)
    for name, c in pipe.items():
        try:
            c.on_policy_output(out)
        except Exception as exc:
            msg = f"on_policy_output raised {type(exc).__name__}: {exc}"
            raise _fail(check, msg, pipe, name) from exc


def _clone(pipe: ConnectorPipeline, check: str) -> ConnectorPipeline:
    try:
        return copy.deepcopy(pipe)
    except Exception as exc:
        raise _fail(check, f"cannot deep-copy the pipeline to check it: {exc}") from exc


def _all_rows(s: _Setup, t: int) -> list[tuple[int, Any, int, float]]:
    return [(int(s.env_ids[i]), s.agent_ids[i], (i + t) % s.n, i + 1.0) for i in range(s.n)]


def _reset_all(pipe: ConnectorPipeline, env_ids: Any) -> None:
    for e in sorted({int(e) for e in env_ids}):
        pipe.reset(e)
