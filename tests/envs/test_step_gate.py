"""StepGate: a pool's next step may start once every row a poll returned has its command."""

from __future__ import annotations

import numpy as np

from rlconnect.envs.rows import EnvRowsBuilder


def _rows(n: int, done: list[int], ids: list[int] | None = None):
    ids = list(range(n)) if ids is None else ids
    m = len(ids)
    term = np.isin(ids, done)
    return EnvRowsBuilder.columns(
        np.asarray(ids, dtype=np.int64),
        np.zeros((m, 2), np.float32),
        np.zeros(m),
        term,
        np.zeros(m, dtype=bool),
        [{}] * m,
        np.zeros(m, dtype=bool),
    )


def _gate(n: int):
    from rlconnect.envs.step_gate import StepGate

    todo = np.zeros(n, dtype=bool)
    return StepGate(todo), todo


def test_the_gate_opens_with_the_last_action_and_queues_ended_episodes_resets():
    gate, todo = _gate(5)
    ended = gate.returned(_rows(5, done=[3, 1]))
    assert ended.tolist() == [1, 3]
    todo[ended] = True  # the caller queues those resets
    todo[[0, 2]] = True
    assert not gate.answered()
    todo[2] = True  # an answer given twice counts once
    assert not gate.answered()
    todo[4] = True
    assert gate.answered()
    assert not gate.answered()  # open already: nothing more to start
    assert gate.take_reset(1) and not gate.take_reset(1)  # queued once, taken once
    assert not gate.take_reset(0)  # not ended: the caller resets it itself


def test_an_asynchronous_polls_rows_are_counted_alone():
    gate, todo = _gate(6)
    assert gate.returned(_rows(6, done=[], ids=[1, 4])).tolist() == []
    todo[[0, 2, 3]] = True  # not returned by this poll
    assert not gate.answered()
    todo[[1, 4]] = True
    assert gate.answered()


def test_a_poll_of_only_ended_episodes_or_no_dense_rows_leaves_the_gate_shut():
    gate, todo = _gate(3)
    assert gate.returned(_rows(3, done=[0, 1, 2])).tolist() == [0, 1, 2]
    todo[:] = True
    assert not gate.answered()  # nothing waited: the poll sends
    todo[:] = False
    rows = _rows(3, done=[1]).without_envs({2: RuntimeError("bad")})  # not dense any more
    assert gate.returned(rows).tolist() == []
    todo[[0, 1]] = True
    assert not gate.answered() and not gate.take_reset(1)
