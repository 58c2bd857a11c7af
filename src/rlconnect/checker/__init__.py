"""Check a connector or pipeline against the connector contract, on your own observations.

``check_pipeline(pipe, observations)`` runs four checks and returns a ``CheckReport``, or
raises ``PipelineCheckError`` naming the check, the member where the problem shows first,
and what differed::

    output_in_space         every member's output lies in the space it declares
    eval_freezes_statistics after in_eval(), calls leave get_statistics() unchanged
    isolation_and_reset     each (env_id, agent_id) keeps its own state; reset(env_id) clears
                            that env's state only
    save_load_reproduces    save_pipeline/load_pipeline, then identical inputs -> identical outputs

With ``device="cpu"`` (or ``"cuda:0"``...) a fifth check runs the tensor path:

    tensor_matches_numpy    the same rows as torch tensors on that device (fixed layout,
                            ``mask``, ``reset_where``) give each member's numpy outputs
                            within float32 rounding, with no host read; statistics saved
                            on either side load on the other

Every check runs on deep copies: the pipeline you pass is never modified. Agent pipelines
get ``rewards``, ``terminateds``, ``truncateds`` and ``t`` columns, and between steps an
``on_policy_output`` with seeded actions (and ``state_out_*`` columns when the context
has ``initial_states``), so connectors that buffer actions or RNN state are exercised too.
For an action pipeline, ``observations`` is the batch of policy outputs it transforms.

This module holds the checks; their machinery lives in private siblings: ``_replay``
(the inputs, and feeding rows through the members), ``_compare`` (where two traces or
statistics first differ), ``_errors`` (``PipelineCheckError``) and ``_tensor`` (the
tensor path). The checker sits above ``rlconnect.connectors`` and
``rlconnect.checkpoints``: ``save_load_reproduces`` runs a pipeline through its file.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import tree

from rlconnect.checker._compare import _compare, _stats, _stats_diff
from rlconnect.checker._errors import PipelineCheckError, _fail
from rlconnect.checker._replay import (
    _all_rows,
    _clone,
    _copy_leaf,
    _prepare,
    _reset_all,
    _Setup,
    _step,
    _take,
)
from rlconnect.checker._tensor import run_tensor_check
from rlconnect.checkpoints.pipelines import load_pipeline, save_pipeline
from rlconnect.connectors.pipeline import ConnectorPipeline
from rlconnect.spaces import batch_in_space, check_batch

__all__ = [
    "CHECKS",
    "CheckReport",
    "PipelineCheckError",
    "check_eval_freezes_statistics",
    "check_isolation_and_reset",
    "check_output_in_space",
    "check_pipeline",
    "check_save_load_reproduces",
    "check_tensor_matches_numpy",
]

CHECKS = (
    "output_in_space",
    "eval_freezes_statistics",
    "isolation_and_reset",
    "save_load_reproduces",
)
"""The checks ``check_pipeline`` runs, in order: each later one relies on the earlier ones
(isolation runs in eval mode; save/load compares after ``reset``)."""


@attrs.frozen
class CheckReport:
    """What ``check_pipeline`` verified: the pipeline's kind, its members and the checks."""

    kind: str
    members: tuple[str, ...]
    checks: tuple[str, ...]
    rows: int
    steps: int

    def __str__(self) -> str:
        chain = " -> ".join(self.members) or "empty"
        done = ", ".join(self.checks)
        return f"{self.kind}({chain}): passed {done} ({self.rows} rows, {self.steps} steps)"


# -- the checks ---------------------------------------------------------------------------------

Kw = dict[str, Any]


def check_output_in_space(pipeline_or_connector: Any, observations: Any = None, **kw: Any) -> None:
    """Every member's output column (``obs`` / ``actions``) lies in its declared output space.

    A member answers for the rows it received inside its input space: an action pipeline
    may be fed policy outputs outside the action space, which e.g. ``ConvertToNumpy``
    passes on unchanged.
    """
    s = _prepare(pipeline_or_connector, observations, **_kw(kw))
    check = "output_in_space"
    pipe = _clone(s.pipe, check)
    _reset_all(pipe, s.env_ids)
    members = dict(pipe.items())
    for t in range(s.steps):
        rows = _all_rows(s, t)
        prev = tree.map_structure(_copy_leaf, _take(s.inputs, np.array([r[2] for r in rows])))
        for name, snap in _step(s, pipe, check, rows, t):
            member = members[name]
            inside = _rows_inside(member.input_space, prev)
            prev = snap.get(s.column)
            try:
                check_batch(member.bound_output_space, _take(prev, inside), field=s.column)
            except ValueError as exc:
                raise _fail(check, f"step {t}: {exc}", pipe, name) from None


def _rows_inside(space: gym.Space, batch: Any) -> np.ndarray:
    try:
        return np.flatnonzero(batch_in_space(space, batch))
    except (ValueError, TypeError):
        return np.zeros(0, np.intp)


def check_save_load_reproduces(
    pipeline_or_connector: Any, observations: Any = None, **kw: Any
) -> None:
    """Saved and loaded after a history, then both reset: identical inputs, identical outputs."""
    s = _prepare(pipeline_or_connector, observations, **_kw(kw))
    check = "save_load_reproduces"
    pipe = _clone(s.pipe, check)
    _reset_all(pipe, s.env_ids)
    for t in range(s.steps):
        _step(s, pipe, check, _all_rows(s, t), t)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pipeline")
        try:
            save_pipeline(pipe, path)
        except Exception as exc:
            raise _fail(check, f"save_pipeline raised: {exc}", pipe, _unsaveable(pipe)) from exc
        try:
            loaded = load_pipeline(path, copy.deepcopy(pipe.ctx))
        except Exception as exc:
            raise _fail(check, f"load_pipeline raised: {exc}") from exc
    if loaded.names != pipe.names:
        raise _fail(check, f"members differ after load: {pipe.names} vs {loaded.names}")
    (loaded.in_training if pipe.is_training else loaded.in_eval)()
    stats = _stats_diff(_stats(pipe, check), _stats(loaded, check))
    if stats is not None:
        raise _fail(check, f"after load, {stats[1]} (original vs loaded)", pipe, stats[0])
    _reset_all(pipe, s.env_ids)
    _reset_all(loaded, s.env_ids)
    everything = (slice(None), slice(None))
    hint = (
        ". Are all its statistics in get_statistics(), and does reset() clear "
        "its per-episode state?"
    )
    for t in range(2 * s.steps):  # eval first (frozen statistics), then training
        mode = "eval" if t < s.steps else "training"
        for p in (pipe, loaded):
            (p.in_eval if mode == "eval" else p.in_training)()
        rows = _all_rows(s, t)
        got, want = _step(s, pipe, check, rows, t), _step(s, loaded, check, rows, t)
        ctx = (
            f"step {t} ({mode} mode) after save/load and reset, outputs differ (original vs loaded)"
        )
        _compare(check, pipe, got, want, everything, ctx, hint)


def _unsaveable(pipe: ConnectorPipeline) -> str | None:
    for name, c in pipe.items():
        try:
            c.to_state()
        except Exception:
            return name
    return None


def check_eval_freezes_statistics(
    pipeline_or_connector: Any, observations: Any = None, **kw: Any
) -> None:
    """After ``in_eval()``, calls leave ``get_statistics()`` unchanged."""
    s = _prepare(pipeline_or_connector, observations, **_kw(kw))
    check = "eval_freezes_statistics"
    pipe = _clone(s.pipe, check)
    pipe.in_training()
    _reset_all(pipe, s.env_ids)
    for t in range(s.steps):
        _step(s, pipe, check, _all_rows(s, t), t)
    before = _stats(pipe, check)
    pipe.in_eval()
    for t in range(s.steps, 2 * s.steps):
        _step(s, pipe, check, _all_rows(s, t), t)
        changed = _stats_diff(before, _stats(pipe, check))
        if changed is not None:
            msg = f"step {t} in eval mode changed the {changed[1]} (before vs after)"
            raise _fail(check, msg, pipe, changed[0])
    pipe.in_training()


def _keys(s: _Setup) -> list[tuple[int, Any]]:
    """Three keys: two agents in one env, and the first agent again in a second env."""
    envs = list(dict.fromkeys(s.env_ids.tolist()))
    agents = list(dict.fromkeys(s.agent_ids))
    e0 = envs[0]
    e1 = envs[1] if len(envs) > 1 else e0 + 1
    a0 = agents[0]
    other = a0 + 1 if isinstance(a0, int) else f"{a0}_b"
    a1 = agents[1] if len(agents) > 1 else other
    return [(e0, a0), (e0, a1), (e1, a0)]


def check_isolation_and_reset(
    pipeline_or_connector: Any, observations: Any = None, **kw: Any
) -> None:
    """Rows of several (env, agent) keys fed together equal each fed alone; reset is per env.

    Statistics (a running mean...) are shared by all agents by design, so this check runs
    in eval mode, where they are frozen; per-episode state works as in training.
    """
    s = _prepare(pipeline_or_connector, observations, **_kw(kw))
    check = "isolation_and_reset"
    base = _clone(s.pipe, check)
    base.in_eval()
    keys = _keys(s)
    _reset_all(base, [e for e, _ in keys])
    before = _stats(base, check)
    together = _clone(base, check)
    try:
        _isolation(s, base, together, keys, check)
    except PipelineCheckError as exc:
        changed = _stats_diff(before, _stats(together, check))
        if changed is None or changed[0] != exc.member:
            raise
        hint = " (its statistics changed in eval mode: see eval_freezes_statistics)"
        raise PipelineCheckError(check, exc.detail + hint, changed[0]) from exc


def _isolation(s: _Setup, base: Any, together: Any, keys: Any, check: str) -> None:
    alone = [_clone(base, check) for _ in keys]

    def row(k: int, t: int) -> tuple[int, Any, int, float]:
        return (keys[k][0], keys[k][1], (t + 2 * k) % s.n, k + 1.0)

    for t in range(s.steps):
        order = [(k + t) % len(keys) for k in range(len(keys))]  # rotate: no state by position
        got = _step(s, together, check, [row(k, t) for k in order], t)
        for pos, k in enumerate(order):
            want = _step(s, alone[k], check, [row(k, t)], t)
            others = [keys[j] for j in order if j != k]
            ctx = f"step {t}: key {keys[k]} fed together with {others} differs from fed alone"
            _compare(check, together, got, want, ([pos], [0]), ctx)
    e0, t = keys[0][0], s.steps
    together.reset(e0)
    got = _step(s, together, check, [row(k, t) for k in range(len(keys))], t)
    for k, key in enumerate(keys):
        if key[0] == e0:
            want = _step(s, _clone(base, check), check, [row(k, t)], t)
            ctx = f"after reset({e0}), key {key} differs from a fresh pipeline's output"
        else:
            want = _step(s, alone[k], check, [row(k, t)], t)
            ctx = f"reset({e0}) changed the state of key {key} of another env"
        _compare(check, together, got, want, ([k], [0]), ctx)


def check_tensor_matches_numpy(
    pipeline_or_connector: Any, observations: Any = None, device: str = "cpu", **kw: Any
) -> None:
    """On torch tensors on ``device`` every member gives its numpy outputs (floats within
    float32 rounding: ``rtol = atol = 1e-5``), reads no tensor on the host, and statistics
    saved from either path load on the other. Rows keep the tensor path's fixed layout;
    at odd steps a third of them are outside ``mask`` (the numpy side gets only the real
    rows), and the first sub-env ends after the second step (``reset_where`` / ``reset``).
    A member without ``takes_tensors`` fails the check, named."""
    s = _prepare(pipeline_or_connector, observations, **_kw(kw))
    run_tensor_check(s, device)


_CHECK_FNS: dict[str, Callable[..., None]] = {
    "output_in_space": check_output_in_space,
    "eval_freezes_statistics": check_eval_freezes_statistics,
    "isolation_and_reset": check_isolation_and_reset,
    "save_load_reproduces": check_save_load_reproduces,
}

_KW_NAMES = ("env_ids", "agent_ids", "rewards", "actions", "steps")


def _kw(kw: Kw) -> Kw:
    unknown = sorted(set(kw) - set(_KW_NAMES))
    if unknown:
        raise TypeError(f"unknown check options {unknown}; allowed: {list(_KW_NAMES)}")
    out: Kw = dict.fromkeys(_KW_NAMES[:-1])
    out["steps"] = 3
    out.update(kw)
    return out


def check_pipeline(
    pipeline_or_connector: Any,
    observations: Any = None,
    *,
    env_ids: Sequence[int] | None = None,
    agent_ids: Sequence[Any] | None = None,
    rewards: Any = None,
    actions: Any = None,
    steps: int = 3,
    device: str | None = None,
) -> CheckReport:
    """Run every check in ``CHECKS`` on a pipeline (or one connector, wrapped in a pipeline);
    with ``device`` also ``tensor_matches_numpy`` on torch tensors on that device.

    Args:
        pipeline_or_connector: an agent or action pipeline, or a single connector.
        observations: B rows of the context's ``observation_space`` (a stacked batch); for an
            action pipeline, B rows of policy outputs. None samples 8 rows (seeded).
        env_ids: the B rows' sub-env ids (default ``range(B)``).
        agent_ids: the B rows' agent ids (default ``"agent0"`` for every row).
        rewards: B rewards (default: seeded normal values times 3).
        actions: rows of ``ctx.action_space`` given to ``on_policy_output`` (default: seeded
            samples of it).
        steps: calls per check.
        device: a torch device (``"cpu"``, ``"cuda:0"``) to check the tensor path on too.

    Raises:
        PipelineCheckError: naming the check, the member and what differed.
    """
    kw = {"env_ids": env_ids, "agent_ids": agent_ids, "rewards": rewards, "actions": actions}
    s = _prepare(pipeline_or_connector, observations, steps=steps, **kw)
    for fn in _CHECK_FNS.values():
        fn(s.pipe, s.inputs, steps=steps, **kw)
    checks: tuple[str, ...] = CHECKS
    if device is not None:
        check_tensor_matches_numpy(s.pipe, s.inputs, device=device, steps=steps, **kw)
        checks = (*CHECKS, "tensor_matches_numpy")
    return CheckReport(type(s.pipe).__name__, tuple(s.pipe.names), checks, s.n, steps)
