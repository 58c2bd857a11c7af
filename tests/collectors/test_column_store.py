"""ColumnStore and EnvStepLog: O(1) appends, merged in bulk, read back exactly."""

from __future__ import annotations

import weakref

import numpy as np
import pytest

from rlconnect.collectors import env_steps, store
from rlconnect.collectors.env_steps import EnvStepLog
from rlconnect.collectors.store import ColumnStore, fill_rows


@pytest.fixture(params=[4, None], ids=["merge-every-4", "default-merging"])
def merging(request, monkeypatch):
    """Chunks merged every 4 appends (many merges), or as by default (none here)."""
    if request.param:
        monkeypatch.setattr(store, "MERGE_EVERY", request.param)
        monkeypatch.setattr(env_steps, "MERGE_EVERY", request.param)


@pytest.fixture
def merge_every_4(monkeypatch):
    monkeypatch.setattr(store, "MERGE_EVERY", 4)


def _chunk(i: int) -> dict:
    """Two rows: an array, a scalar shared by both, a list of infos, a nest, and an
    output that only odd chunks have (the others read as zeros there)."""
    cols = {
        "x": np.array([i, i], dtype=np.int32),
        "k": i,
        "infos": [{}, {"i": i}],
        "state": {"h": np.full((2, 3), i, np.float32)},
    }
    if i % 2:
        cols["y"] = np.array([2.0 * i, 2.0 * i])
    return cols


def test_columns_read_back_as_appended(merging):
    s = ColumnStore()
    for i in range(30):
        assert s.append(_chunk(i), 2) == 2 * i
    assert len(s) == 60 and s.names == ["x", "k", "infos", "state", "y"]
    np.testing.assert_array_equal(s.column("x"), np.repeat(np.arange(30), 2))
    assert s.column("x").dtype == np.int32
    np.testing.assert_array_equal(s.column("k"), np.repeat(np.arange(30), 2))
    assert [d.get("i") for d in s.column("infos")[1::2]] == list(range(30))
    np.testing.assert_array_equal(s.column("state")["h"][:, 0], np.repeat(np.arange(30), 2))
    y = s.column("y")
    np.testing.assert_array_equal(y[2::4], 2.0 * np.arange(1, 30, 2))
    assert not y[0::4].any()  # even chunks had no "y": zeros
    s.keep(np.array([59, 0, 3]))
    np.testing.assert_array_equal(s.column("x"), [29, 0, 1])
    assert s.column("infos")[0] == {"i": 29}


def test_appended_chunks_are_let_go_once_merged(merge_every_4):
    """Memory grows with rows, not with steps: every few appends the chunks are merged
    into one array per column and the arrays appended are no longer held."""
    s = ColumnStore()
    first = np.zeros(2)
    ref = weakref.ref(first)
    s.append({"x": first}, 2)
    del first
    for _ in range(3):
        assert ref() is not None
        s.append({"x": np.ones(2)}, 2)
    assert ref() is None
    np.testing.assert_array_equal(s.column("x"), [0, 0, 1, 1, 1, 1, 1, 1])


def test_a_column_that_comes_late_reads_as_zeros_before():
    s = ColumnStore()
    s.append({"x": np.ones(2)}, 2)
    s.column("x")  # merged
    s.append({"x": np.ones(1), "late": np.array([[5, 6]], np.int16)}, 1)
    assert "late" in s
    np.testing.assert_array_equal(s.column("late"), [[0, 0], [0, 0], [5, 6]])
    assert s.column("late").dtype == np.int16


@pytest.mark.parametrize(
    ("number", "array", "dtype"),
    [
        (False, np.array([True, False, True]), np.bool_),
        (7, np.array([1, 2, 3], np.int64), np.int64),
        (7, np.array([0.5, 1.5, 2.5]), np.float64),  # an array wider than the numbers
        (np.float32(0.25), np.array([1, 2, 3], np.int16), np.float32),
    ],
)
def test_a_column_of_numbers_and_arrays_reads_back_in_order(merging, number, array, dtype):
    """Chunks giving one number for all their rows (a flag no row sets), and some giving
    an array (a row sets it): each row reads back its own value, in the common type."""
    s = ColumnStore()
    expected = []
    for i in range(13):
        if i in (0, 5, 6, 12):  # first, consecutive, and last chunks are arrays
            s.append({"c": array, "i": i}, 3)
            expected.extend(array.tolist())
        else:
            s.append({"c": number, "i": i}, 3)
            expected.extend([number] * 3)
    column = s.column("c")
    assert column.dtype == dtype
    np.testing.assert_array_equal(column, np.asarray(expected, dtype))
    np.testing.assert_array_equal(s.column("i"), np.repeat(np.arange(13), 3))


def test_fill_rows_puts_values_where_the_rows_acted():
    where = np.array([True, False, True])
    np.testing.assert_array_equal(fill_rows(np.array([4, 5]), where, 3), [4, 0, 5])
    nest = fill_rows({"a": np.array([1.0, 2.0])}, where, 3)
    np.testing.assert_array_equal(nest["a"], [1.0, 0.0, 2.0])


def test_env_step_log(merging):
    log = EnvStepLog()
    for poll in range(10):
        envs = np.arange(poll % 3 + 1, dtype=np.int64)
        steps = 1 if poll % 2 else np.full(len(envs), 2, np.int64)  # a number or per step
        log.add(poll, envs, 100 + envs, steps)
    log.add(10, np.zeros(0, np.int64), np.zeros(0, np.int64), 1)  # nothing stepped
    lengths = [p % 3 + 1 for p in range(10)]
    assert log.size == sum(lengths) == 19
    expected_steps = np.repeat([2 if p % 2 == 0 else 1 for p in range(10)], lengths)
    assert log.agent_steps == expected_steps.sum()
    cols = log.columns()
    np.testing.assert_array_equal(cols.poll, np.repeat(np.arange(10), lengths))
    np.testing.assert_array_equal(cols.env, np.concatenate([np.arange(k) for k in lengths]))
    np.testing.assert_array_equal(cols.eps, cols.env + 100)
    np.testing.assert_array_equal(cols.agent_steps, expected_steps)
    assert all(c.dtype == np.int64 for c in cols)
    log.keep(np.flatnonzero(cols.poll >= 8))
    assert log.size == 4 and log.agent_steps == 3 * 2 + 1
    np.testing.assert_array_equal(log.columns().poll, [8, 8, 8, 9])


def test_env_step_log_of_one_sub_env(merging):
    """Polls that step one sub-env each (a runner of one, turn-based polls), some with
    per-step arrays and some with a number, then a wider poll: the same columns."""
    log = EnvStepLog()
    for poll in range(9):
        env = np.array([poll % 2])
        steps = 3 if poll % 3 else np.array([poll])
        log.add(poll, env, env + 7 * poll, steps)
    log.add(9, np.array([0, 1]), np.array([70, 71]), np.array([1, 2]))
    cols = log.columns()
    polls = np.arange(9)
    np.testing.assert_array_equal(cols.poll, [*polls, 9, 9])
    np.testing.assert_array_equal(cols.env, [*(polls % 2), 0, 1])
    np.testing.assert_array_equal(cols.eps, [*(polls % 2 + 7 * polls), 70, 71])
    expected = [3 if p % 3 else p for p in polls] + [1, 2]
    np.testing.assert_array_equal(cols.agent_steps, expected)
    assert log.size == 11 and log.agent_steps == sum(expected)
    assert all(c.dtype == np.int64 and c.ndim == 1 for c in cols)
