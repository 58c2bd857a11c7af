"""The per-(env_id, agent_id) slot table shared by stateful agent connectors."""

import numpy as np
import pytest

from rlconnect.connectors.agent._slots import SlotTable


def test_allocates_and_flags_new_rows():
    t = SlotTable(capacity=2)
    t.add("x", np.zeros((0, 3), np.float32))
    slots, new = t.lookup([(0, "a"), (1, "a")])
    assert slots.tolist() == [0, 1]
    assert new.tolist() == [True, True]
    slots, new = t.lookup([(1, "a"), (0, "a"), (0, "b")])
    assert slots.tolist() == [1, 0, 2]
    assert new.tolist() == [False, False, True]
    assert t.capacity >= 3
    assert t["x"].shape == (t.capacity, 3)


def test_fast_path_reuses_index_array():
    t = SlotTable()
    keys = [(0, "a"), (1, "a")]
    first, _ = t.lookup(keys)
    again, new = t.lookup(list(keys))
    assert again is first
    assert not new.any()


def test_reset_frees_only_that_env_and_reuses_slots():
    t = SlotTable(capacity=4)
    t.lookup([(0, "a"), (0, "b"), (1, "a")])
    t.reset(0)
    assert (1, "a") in t
    assert (0, "a") not in t
    assert len(t) == 1
    slots, new = t.lookup([(1, "a"), (0, "a")])
    assert slots[0] == 2
    assert slots[1] in (0, 1)  # a freed slot is reused
    assert new.tolist() == [False, True]
    assert t.capacity == 4


def test_growth_keeps_contents():
    t = SlotTable(capacity=1)
    t.add("x", np.zeros((0,), np.int64))
    slots, _ = t.lookup([(0, "a")])
    t["x"][slots] = 7
    slots2, _ = t.lookup([(0, "a"), (1, "a"), (2, "a")])
    assert t["x"][slots2[0]] == 7
    assert t.capacity >= 3


def test_nested_arrays_grow():
    t = SlotTable(capacity=1)
    t.add("n", {"a": np.zeros((0, 2)), "b": (np.zeros((0,), np.int64),)})
    t.lookup([(0, 0), (0, 1), (0, 2)])
    assert t["n"]["a"].shape == (t.capacity, 2)
    assert t["n"]["b"][0].shape == (t.capacity,)


def test_find_does_not_allocate():
    t = SlotTable()
    t.lookup([(0, "a")])
    assert t.find([(0, "a"), (9, "z")]).tolist() == [0, -1]
    assert (9, "z") not in t


def test_duplicate_keys_raise():
    t = SlotTable()
    with pytest.raises(ValueError, match="duplicate"):
        t.lookup([(0, "a"), (0, "a")])
    t.lookup([(0, "a")])
    with pytest.raises(ValueError, match="duplicate"):
        t.lookup([(0, "a"), (0, "a")])
