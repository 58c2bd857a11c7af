"""The tensor check: the same rows through a pipeline on numpy and on torch tensors.

``check_tensor_matches_numpy`` replays the steps of the other checks twice, on deep copies:
once with numpy rows (only the real rows of each call, as the numpy path passes them) and
once with torch tensors on ``device`` in the tensor path's fixed layout (every row at every
call, ``mask`` marking the real ones, ``reset_where`` instead of ``reset``). Each member's
outputs must agree on the real rows within float32 rounding, no member may read a tensor
on the host (``ConvertToNumpy`` excepted: that is its job), and statistics saved from
either side must load on the other and give the same outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

from rlconnect.checker._compare import _path_text
from rlconnect.checker._errors import _fail
from rlconnect.checker._replay import _clone, _reset_all, _Setup, _take
from rlconnect.connectors._host_reads import HostReadCounter
from rlconnect.connectors._tensors import numpy_of
from rlconnect.connectors.action.convert_to_numpy import ConvertToNumpy
from rlconnect.connectors.base import ActionData, AgentData
from rlconnect.connectors.pipeline import AgentConnectorPipeline, ConnectorPipeline

__all__ = ["ATOL", "RTOL", "run_tensor_check"]

RTOL = 1e-5
ATOL = 1e-5
"""How close a float output on tensors must be to the numpy one (float32 rounding)."""

CHECK = "tensor_matches_numpy"


def _tensors(batch: Any, device: str) -> Any:
    import torch

    return tree.map_structure(lambda x: torch.as_tensor(np.asarray(x), device=device), batch)


def _mask(s: _Setup, t: int) -> np.ndarray:
    """Every row at even steps; at odd steps a third of them are not real."""
    rows = np.arange(s.n)
    return np.ones(s.n, bool) if t % 2 == 0 else (rows + t) % 3 != 0


def _columns(s: _Setup, idx: np.ndarray, t: int) -> dict[str, Any]:
    if not s.is_agent:
        return {"actions": _take(s.inputs, idx)}
    m = len(idx)
    return {
        "obs": _take(s.inputs, idx),
        "rewards": np.asarray(s.rewards[idx % len(s.rewards)], np.float32),
        "terminateds": np.zeros(m, bool),
        "truncateds": np.zeros(m, bool),
        "t": np.full(m, t, np.int64),
    }


def _run_members(pipe: ConnectorPipeline, data: Any, t: int, counted: bool) -> list:
    """Each member's output columns (as numpy), counting host reads per member."""
    trace = []
    for name, c in pipe.items():
        with HostReadCounter() as reads:
            try:
                data = c(data)
            except Exception as exc:
                side = "tensors" if counted else "numpy"
                msg = f"raised {type(exc).__name__} at step {t} on {side}: {exc}"
                raise _fail(CHECK, msg, pipe, name) from exc
        if counted and reads.total and not isinstance(c, ConvertToNumpy):  # its job: to host
            msg = f"step {t}: {reads.total} host read(s) on tensors ({dict(reads.by_name)})"
            raise _fail(CHECK, msg, pipe, name)
        trace.append((name, {k: tree.map_structure(numpy_of, v) for k, v in data.columns.items()}))
    return [trace, data]


def _numpy_step(s: _Setup, pipe: ConnectorPipeline, t: int, real: np.ndarray) -> list:
    idx = (np.flatnonzero(real) + t) % s.n
    kind = AgentData if s.is_agent else ActionData
    data = kind(s.env_ids[real], tuple(np.asarray(s.agent_ids, object)[real]), _columns(s, idx, t))
    trace, data = _run_members(pipe, data, t, counted=False)
    if isinstance(pipe, AgentConnectorPipeline):  # s.is_agent, as the type checker sees it
        _feed_back(s, pipe, data, real, idx, None)
    return trace


def _tensor_step(s: _Setup, pipe: ConnectorPipeline, t: int, real: np.ndarray, device: str) -> list:
    import torch

    idx = (np.arange(s.n) + t) % s.n
    kind = AgentData if s.is_agent else ActionData
    env_ids = torch.as_tensor(s.env_ids, device=device)
    mask = None if real.all() else torch.as_tensor(real, device=device)
    data = kind(env_ids, s.agent_ids, _tensors(_columns(s, idx, t), device), mask)
    trace, data = _run_members(pipe, data, t, counted=True)
    if isinstance(pipe, AgentConnectorPipeline):  # s.is_agent, as the type checker sees it
        _feed_back(s, pipe, data, real, idx, device)
    return trace


def _feed_back(
    s: _Setup,
    pipe: AgentConnectorPipeline,
    data: Any,
    real: np.ndarray,
    idx: np.ndarray,
    device: str | None,
) -> None:
    """``on_policy_output`` with seeded actions and RNN state, on the real rows."""
    rows = np.flatnonzero(real) if device is None else np.arange(s.n)
    cols: dict[str, Any] = {}
    if s.actions is not None:
        cols["actions"] = _take(s.actions, idx % s.n_actions)
    for i, init in enumerate(pipe.ctx.initial_states):
        init = np.asarray(init)
        base = numpy_of(data.get(f"state_in_{i}"))
        if base is None:
            base = np.broadcast_to(init, (len(idx), *init.shape))
        bump = (rows + 1.0).reshape(-1, *([1] * init.ndim))
        cols[f"state_out_{i}"] = (np.asarray(base) + bump).astype(init.dtype)
    if device is None:
        out = ActionData(s.env_ids[real], data.agent_ids, cols)
    else:
        import torch

        mask = None if real.all() else torch.as_tensor(real, device=device)
        env_ids = torch.as_tensor(s.env_ids, device=device)
        out = ActionData(env_ids, s.agent_ids, _tensors(cols, device), mask)
    with HostReadCounter() as reads:
        pipe.on_policy_output(out)
    if device is not None and reads.total:
        raise _fail(CHECK, f"on_policy_output made {reads.total} host read(s)", pipe)


def _close(a: Any, b: Any) -> str | None:
    """None when two nests agree (floats within RTOL/ATOL, the rest exactly), else what
    differs first."""
    try:
        tree.assert_same_structure(a, b, check_types=False)
    except (ValueError, TypeError) as exc:
        return f": structure differs ({exc})"
    for (path, x), (_, y) in zip(tree.flatten_with_path(a), tree.flatten_with_path(b)):
        x, y = np.asarray(x), np.asarray(y)
        where = _path_text(path)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{where}: {x.dtype}{x.shape} on numpy vs {y.dtype}{y.shape} on tensors"
        if x.dtype.kind in "fc":
            same = np.isclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True)
        else:
            same = x == y
        if not np.all(same):
            bad = np.argwhere(~np.asarray(same))
            first = tuple(int(i) for i in bad[0])
            return (
                f"{where}: {len(bad)} of {x.size} values differ, e.g. at {first}: "
                f"{x[first]!r} on numpy vs {y[first]!r} on tensors"
            )
    return None


def _compare(
    pipe: ConnectorPipeline, got: list, want: list, real: np.ndarray, context: str
) -> None:
    rows = np.flatnonzero(real)
    for (name, on_numpy), (_, on_tensors) in zip(want, got):
        for col, value in on_numpy.items():
            if col not in on_tensors:
                raise _fail(CHECK, f"{context}: column {col!r} missing on tensors", pipe, name)
            d = _close(value, _take(on_tensors[col], rows))
            if d is not None:
                raise _fail(CHECK, f"{context}: column {col!r}{d}", pipe, name)


def _ended(s: _Setup, env_id: int, device: str) -> Any:
    import torch

    ended = torch.zeros(int(s.env_ids.max()) + 1, dtype=torch.bool, device=device)
    ended[env_id] = True
    return ended


def _replay(
    s: _Setup,
    on_numpy: ConnectorPipeline,
    on_tensors: ConnectorPipeline,
    device: str,
    steps: range,
    label: str,
) -> None:
    """Feed the same rows to both; reset the first sub-env after the second step."""
    first_env = int(s.env_ids[0])
    for t in steps:
        real = _mask(s, t)
        want = _numpy_step(s, on_numpy, t, real)
        got = _tensor_step(s, on_tensors, t, real, device)
        _compare(on_tensors, got, want, real, f"step {t}{label}")
        if t == steps.start + 1:
            on_numpy.reset(first_env)
            ended = _ended(s, first_env, device)
            with HostReadCounter() as reads:
                on_tensors.reset_where(ended)
            if reads.total:
                raise _fail(CHECK, f"reset_where made {reads.total} host read(s)", on_tensors)


def run_tensor_check(s: _Setup, device: str) -> None:
    """Numpy vs tensors on the same rows; then statistics saved on one side load on the
    other and both keep agreeing."""
    refusals = s.pipe.tensor_refusals()
    if refusals:
        raise _fail(
            CHECK,
            f"members {refusals} do not take tensors (set takes_tensors = True on a "
            "connector that works on torch tensors)",
            s.pipe,
            refusals[0],
        )
    on_numpy, on_tensors = _clone(s.pipe, CHECK), _clone(s.pipe, CHECK)
    for p in (on_numpy, on_tensors):
        p.in_training()
        _reset_all(p, s.env_ids)
    _replay(s, on_numpy, on_tensors, device, range(s.steps), "")
    pending = {n: bool(f) for n, f in on_tensors.pending_flags().items()}
    if any(pending.values()):
        raise _fail(CHECK, f"deferred checks failed on valid rows: {pending}", on_tensors)
    saved_numpy, saved_tensors = on_numpy.get_statistics(), on_tensors.get_statistics()
    d = _close(saved_numpy, saved_tensors)
    if d is not None:
        raise _fail(CHECK, f"statistics differ (numpy vs tensors){d}", on_tensors)
    for leaf in tree.flatten(saved_tensors):
        if not isinstance(leaf, np.ndarray | int | float | str | bool):
            msg = f"get_statistics() on tensors holds a {type(leaf).__name__}, not numpy/JSON"
            raise _fail(CHECK, msg, on_tensors)
    on_numpy.set_statistics(saved_tensors)  # each side loads what the other saved
    on_tensors.set_statistics(saved_numpy)
    later = range(s.steps, 2 * s.steps)
    _replay(s, on_numpy, on_tensors, device, later, " after loading the other side's statistics")
